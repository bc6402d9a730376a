"""RewardManager: decoding, score placement, parallel time-limited workers, failures."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest
import torch

from rl_algos.rewards import OverlongBuffer, RewardManager, ScoringPool, load_reward_function
from rl_algos.rewards.manager import (
    InvalidScoreError,
    RewardFailureError,
    ScoreLimits,
)
from rl_core import DataProto

USER_REWARD = """
import os
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if "sleep" in solution_str:
        time.sleep(3600)
    if "raise" in solution_str:
        raise RuntimeError("boom " + str(extra_info["index"]))
    if "bad" in solution_str:
        return "not a number"
    if "exit" in solution_str:
        os._exit(3)
    if solution_str.startswith("value"):
        text = solution_str.split()[1]  # "value 1e301", "value nan", "value 10**400"
        return eval(text) if "**" in text else float(text)
    return {"score": float(solution_str == ground_truth), "length": len(solution_str)}
"""


def make_batch(tokenizer, responses, truths, prompt_len=3, width=12):
    """A rollout-shaped DataProto: left-padded prompts, right-padded responses."""
    pad = tokenizer.pad_token_id
    resp = torch.full((len(responses), width), pad, dtype=torch.long)
    prompts = torch.full((len(responses), prompt_len), pad, dtype=torch.long)
    mask = torch.zeros(len(responses), prompt_len + width, dtype=torch.long)
    for i, text in enumerate(responses):
        ids = tokenizer.encode(text, add_special_tokens=False)[:width]
        resp[i, : len(ids)] = torch.tensor(ids)
        prompt_ids = tokenizer.encode("q" * (1 + i % prompt_len), add_special_tokens=False)
        prompts[i, prompt_len - len(prompt_ids) :] = torch.tensor(prompt_ids)
        mask[i, prompt_len - len(prompt_ids) : prompt_len + len(ids)] = 1
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": resp, "attention_mask": mask},
        non_tensors={
            "data_source": ["mine"] * len(responses),
            "reward_model": [{"ground_truth": t, "style": "rule"} for t in truths],
            "extra_info": [{"index": i} for i in range(len(responses))],
        },
    )


@pytest.fixture
def user_fn(tmp_path):
    path = tmp_path / "reward.py"
    path.write_text(USER_REWARD)
    return load_reward_function(path)


def test_scores_land_on_the_last_response_token_in_process(tokenizer, user_fn):
    data = make_batch(
        tokenizer, ["ok", "no", "x" * 20, "bad", "raise"], ["ok", "ok", "x" * 12, "", ""]
    )
    manager = RewardManager(tokenizer, user_fn, num_workers=0, error_score=-1.0)
    out = manager(data)
    scores = out.token_level_scores
    assert scores.shape == (5, 12)
    assert scores[0, 1] == 1.0 and scores[0].sum() == 1.0
    assert scores[1].abs().sum() == 0.0
    assert scores[2, 11] == 1.0  # truncated at the response width: the last column
    assert scores[3, 2] == -1.0 and scores[4, 4] == -1.0
    assert out.metrics["reward/errors"] == 2.0
    assert out.metrics["reward/timeouts"] == 0.0
    assert out.extra["length"].tolist() == [2, 2, 12, None, None]
    assert out.extra["score"].tolist() == [1.0, 0.0, 1.0, None, None]


def test_worker_processes_survive_hangs_crashes_and_errors(tokenizer, user_fn):
    responses = ["ok", "sleep", "raise", "ok", "bad", "exit", "no"]
    truths = ["ok"] * len(responses)
    manager = RewardManager(
        tokenizer,
        user_fn,
        num_workers=2,
        timeout_s=2.0,
        error_score=-0.5,
        limits=ScoreLimits(max_failure_fraction=1.0),  # 4 of 7 fail: go on anyway
    )
    try:
        out = manager(make_batch(tokenizer, responses, truths))
        final = out.token_level_scores.sum(-1).tolist()
        assert final == [1.0, -0.5, -0.5, 1.0, -0.5, -0.5, 0.0]
        assert out.metrics["reward/timeouts"] == 1.0
        assert out.metrics["reward/errors"] == 3.0  # raise, bad return value, dead worker
        assert manager._pool.restarts == 2  # the hung worker and the dead one were replaced
        idle = manager._pool._workers[0].process
        idle.kill()  # a worker that dies between batches is replaced too
        idle.wait()
        again = manager(make_batch(tokenizer, ["ok", "no"], ["ok", "ok"]))  # the run goes on
        assert again.token_level_scores.sum(-1).tolist() == [1.0, 0.0]
        assert again.metrics["reward/errors"] == 0.0
    finally:
        manager.close()
    assert all(not w.process.is_alive() for w in manager._pool._workers)


def test_pool_reports_error_text_and_keeps_order(user_fn):
    calls = [
        {"data_source": "d", "solution_str": s, "ground_truth": "a", "extra_info": {"index": i}}
        for i, s in enumerate(["a", "raise", "b", "a"])
    ]
    with ScoringPool(num_workers=2, timeout_s=30) as pool:
        results = pool.run([(user_fn, c) for c in calls])
    assert [r.status for r in results] == ["ok", "error", "ok", "ok"]
    assert results[1].error == "RuntimeError: boom 1"
    assert [r.value["score"] for r in results if r.status == "ok"] == [1.0, 0.0, 1.0]


def test_a_reward_file_broken_after_the_check_gives_per_sample_errors(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("def compute_score(**kwargs):\n    return 1.0\n")
    fn = load_reward_function(path)
    path.write_text("def broken(:\n")  # workers import it lazily, at the call
    with ScoringPool(num_workers=1, timeout_s=30) as pool:
        (result,) = pool.run([(fn, {})])
    assert result.status == "error"
    assert result.error.startswith("SyntaxError")


def test_a_function_workers_cannot_import_fails_the_pool_loudly(tmp_path, monkeypatch):
    (tmp_path / "vanishing_reward.py").write_text("def score(**kwargs):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import vanishing_reward

    monkeypatch.setitem(sys.modules, "vanishing_reward", vanishing_reward)  # removed after
    (tmp_path / "vanishing_reward.py").unlink()
    for cached in (tmp_path / "__pycache__").glob("vanishing_reward*"):
        cached.unlink()
    with (
        ScoringPool(num_workers=1, timeout_s=30) as pool,
        pytest.raises(RuntimeError, match="failed to start: ModuleNotFoundError"),
    ):
        pool.run([(vanishing_reward.score, {})])


def test_unpicklable_functions_are_refused_clearly():
    with (
        ScoringPool(num_workers=1, timeout_s=30) as pool,
        pytest.raises(TypeError, match="module-level"),
    ):
        pool.run([(lambda **kw: 1.0, {})])


def test_overlong_penalty_is_added(tokenizer, user_fn):
    data = make_batch(tokenizer, ["ok", "x" * 10], ["ok", "nope"])
    manager = RewardManager(
        tokenizer, user_fn, num_workers=0, overlong=OverlongBuffer(4, 1.0, max_response_length=12)
    )
    out = manager(data)
    # length 10 exceeds 12 - 4 = 8 by 2: penalty -2/4 * 1.0
    assert out.token_level_scores.sum(-1).tolist() == [1.0, -0.5]
    assert out.metrics["reward/overlong_penalty_mean"] == pytest.approx(-0.25)


def test_builtin_scoring_by_data_source_and_plain_ground_truth(tokenizer):
    data = make_batch(tokenizer, [r"\boxed{7}", r"\boxed{8}"], ["7", "7"])
    data.non_tensor_batch["data_source"] = np.array(["arithmetic", "arithmetic"], dtype=object)
    del data.non_tensor_batch["reward_model"]
    data.non_tensor_batch["ground_truth"] = np.array(["7", "7"], dtype=object)
    out = RewardManager(tokenizer, num_workers=0)(data)
    assert out.token_level_scores.sum(-1).tolist() == [1.0, 0.0]
    assert out.extra["acc"].tolist() == [1.0, 0.0]


def _values(tokenizer, texts):
    return make_batch(tokenizer, texts, ["x"] * len(texts), width=16)


def test_nonfinite_and_out_of_range_scores_are_counted_and_clipped(tokenizer, user_fn):
    texts = ["value 1e301", "value -1e301", "value nan", "value inf"]
    texts += ["value 10**400", "value 0.25", "value 7"]
    limits = ScoreLimits(min_score=-5.0, max_score=5.0, policy="clip")
    manager = RewardManager(tokenizer, user_fn, num_workers=0, error_score=-1.0, limits=limits)
    out = manager(_values(tokenizer, texts))
    # by hand: clipped to [-5, 5]; NaN cannot be clipped and scores error_score
    assert out.token_level_scores.sum(-1).tolist() == [5.0, -5.0, -1.0, 5.0, 5.0, 0.25, 5.0]
    assert torch.isfinite(out.token_level_scores).all()
    assert out.metrics["reward/nonfinite"] == 3.0  # nan, inf, 10**400 (beyond a float)
    assert out.metrics["reward/out_of_range"] == 3.0  # 1e301, -1e301, 7
    assert out.metrics["reward/errors"] == 0.0


def test_invalid_score_policies_error_score_and_raise(tokenizer, user_fn):
    texts = ["value 1e301", "value 0.5"]
    replace = ScoreLimits(policy="error_score")
    manager = RewardManager(tokenizer, user_fn, num_workers=0, error_score=-1.0, limits=replace)
    assert manager(_values(tokenizer, texts)).token_level_scores.sum(-1).tolist() == [-1.0, 0.5]
    strict = RewardManager(tokenizer, user_fn, num_workers=0, limits=ScoreLimits(policy="raise"))
    with pytest.raises(InvalidScoreError, match=r"sample 0 .* is 1e\+301; expected a finite"):
        strict(_values(tokenizer, texts))


def test_error_score_must_be_finite_and_in_range(tokenizer):
    for bad in (float("nan"), float("inf"), 1e5):
        with pytest.raises(ValueError, match="error_score="):
            RewardManager(tokenizer, None, num_workers=0, error_score=bad)


def test_more_failures_than_allowed_fail_the_batch_loudly(tokenizer, user_fn):
    texts = ["raise", "bad", "value 1", "x"]  # 2 of 4 fail: exactly the limit is allowed
    manager = RewardManager(tokenizer, user_fn, num_workers=0)
    assert manager(_values(tokenizer, texts)).metrics["reward/errors"] == 2.0
    with pytest.raises(RewardFailureError, match=r"3 of 4 reward calls failed .*0\.5; first: "):
        manager(_values(tokenizer, ["raise", "bad", "raise", "x"]))


def test_a_batch_deadline_bounds_the_whole_batch(tokenizer, user_fn):
    # 6 hanging calls on 2 workers: one per-call limit each would take 3 x 2 s in series;
    # the batch deadline of 3 s stops the batch after about 3 s
    texts = ["sleep"] * 6 + ["x"] * 6
    limits = ScoreLimits(batch_timeout_s=3.0, max_failure_fraction=1.0)
    manager = RewardManager(tokenizer, user_fn, num_workers=2, timeout_s=2.0, limits=limits)
    try:
        start = time.monotonic()
        out = manager(_values(tokenizer, texts))
        took = time.monotonic() - start
        assert out.metrics["reward/timeouts"] == 12.0  # nothing else got a worker in time
        assert 2.9 < took < 15, took  # not 6 x 2 s
        again = manager(_values(tokenizer, ["x", "value 1"]))  # replaced workers go on
        assert again.token_level_scores.sum(-1).tolist() == [1.0, 1.0]
    finally:
        manager.close()
    assert all(not w.process.is_alive() for w in manager._pool._workers)


CRASHING_REWARDS = """
import ctypes

def segfault(**kwargs):
    return ctypes.string_at(0)  # reads address 0: SIGSEGV

def hog(**kwargs):
    blocks = []
    while True:  # 64 MiB at a time until the worker's memory cap says no
        blocks.append(bytearray(64 * 1024 * 1024))

def fine(**kwargs):
    return 1.0
"""


def test_a_segfault_and_a_memory_hog_cost_one_call_each_not_the_pool(tmp_path):
    path = tmp_path / "crashing.py"
    path.write_text(CRASHING_REWARDS)
    segfault, hog, fine = (load_reward_function(path, name) for name in ("segfault", "hog", "fine"))
    with ScoringPool(num_workers=1, timeout_s=30, memory_limit_mb=256) as pool:
        results = pool.run([(segfault, {}), (hog, {}), (fine, {})])
        assert [r.status for r in results] == ["error", "error", "ok"]
        assert results[0].error == "worker process died (exit code -11)"  # SIGSEGV, replaced
        assert results[1].error == "MemoryError"  # the cap held: the worker lives on
        assert results[2].value == 1.0
        assert pool.restarts == 1
        with open(f"/proc/{pool._workers[0].process.pid}/oom_score_adj") as f:
            assert f.read().strip() == "1000"  # the OOM killer takes a worker first


def test_memory_limit_is_validated():
    with pytest.raises(ValueError, match="memory_limit_mb must be >= 64 or None, got 8"):
        ScoringPool(num_workers=1, timeout_s=1, memory_limit_mb=8)

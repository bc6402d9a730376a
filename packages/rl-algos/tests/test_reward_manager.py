"""RewardManager: decoding, score placement, parallel time-limited workers, failures."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from rl_algos.rewards import OverlongBuffer, RewardManager, ScoringPool, load_reward_function
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
    manager = RewardManager(tokenizer, user_fn, num_workers=2, timeout_s=2.0, error_score=-0.5)
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

"""The whole RL loop on CPU: PPO (with a critic), GRPO, DAPO and GSPO on a tiny random model
with 2 FSDP training workers, each hosting an `hf` rollout engine, on embedded Ray.

Each run trains on a task the tiny model can learn within a few steps (emit digits, see
`digit_reward.py`) and checks, besides the rise of the mean reward, the batches the actor
is updated on against independent computations: the RL batch layout, masks, rewards
recomputed from the decoded text, the advantage formulas, and that the rollout sampled
with exactly the actor's weights (its log-probs equal the actor's old log-probs).
"""

from __future__ import annotations

import json
import runpy
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from rl_algos.trainer.checkpoints import find_resume_checkpoint
from rl_algos.trainer.loop import RLTrainer
from rl_core.checkpoint import CheckpointError, verify_manifest
from rl_core.protocol import DataProto

pytestmark = [pytest.mark.slow, pytest.mark.ray]

HERE = Path(__file__).resolve().parent
REWARDS = runpy.run_path(str(HERE / "digit_reward.py"))
TARGETS = "0123456789"
RESPONSE_KEYS = (
    "responses",
    "response_mask",
    "rollout_log_probs",
    "old_log_probs",
    "ref_log_prob",
    "values",
    "token_level_scores",
    "token_level_rewards",
    "advantages",
    "returns",
)


@contextmanager
def running(config: Any):
    """An RLTrainer whose actor updates are recorded in ``trainer.updates``."""
    trainer = RLTrainer(config)
    trainer.updates = []
    group = trainer.groups.actor
    update_actor = group.update_actor

    def recording_update_actor(batch: DataProto) -> DataProto:
        trainer.updates.append(batch)
        return update_actor(batch)

    group.update_actor = recording_update_actor
    try:
        yield trainer
    finally:
        trainer.close()


def expected_scores(
    batch: DataProto, tokenizer: Any, fn: str, overlong: int | None
) -> torch.Tensor:
    """Each response's score, from its decoded text with the user function (plus DAPO's
    overlong penalty with a buffer of `overlong` tokens), independently of the trainer."""
    max_len = 8
    scores = []
    for ids, length in zip(batch.batch["responses"], batch.batch["response_mask"].sum(-1)):
        text = tokenizer.decode(ids[: int(length)].tolist(), skip_special_tokens=True)
        score = REWARDS[fn]("digits", text, TARGETS, {})
        if overlong is not None:
            score -= max(0, int(length) - (max_len - overlong)) / overlong
        scores.append(score)
    return torch.tensor(scores, dtype=torch.float64)


def check_layout(batch: DataProto, trainer: RLTrainer, rows: int) -> None:
    """The verl RL batch layout, masks and padding of one update batch."""
    t = batch.batch
    tok = trainer.tokenizer
    pad, eos = tok.pad_token_id, tok.eos_token_id
    cfg = trainer.config
    size, prompt_len = t["prompts"].shape
    resp_len = t["responses"].shape[1]
    assert size == rows == len(batch)
    assert 1 <= resp_len <= cfg.data.max_response_length
    assert prompt_len <= cfg.data.max_prompt_length
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert t[key].shape == (size, prompt_len + resp_len), key
    for key in RESPONSE_KEYS:
        if key in t.keys():  # noqa: SIM118
            assert t[key].shape == (size, resp_len), key
    assert torch.equal(t["input_ids"], torch.cat([t["prompts"], t["responses"]], dim=1))
    assert torch.equal(t["position_ids"], (t["attention_mask"].cumsum(-1) - 1).clamp(min=0))
    prompt_mask, mask = t["attention_mask"][:, :prompt_len], t["response_mask"]
    # prompts left-padded, responses right-padded, padding filled with the pad id
    assert (prompt_mask.diff(dim=1) >= 0).all() and (mask.diff(dim=1) <= 0).all()
    assert (t["prompts"][prompt_mask == 0] == pad).all()
    assert (t["responses"][mask == 0] == pad).all()
    # single-turn: every response token is the policy's and enters the loss
    assert torch.equal(mask, t["attention_mask"][:, prompt_len:])
    # trimmed: no all-padding column is left
    assert prompt_mask.sum(-1).max() == prompt_len and mask.sum(-1).max() == resp_len
    lengths = mask.sum(-1)
    assert (lengths >= 1).all()
    rows_ = torch.arange(size)
    last = t["responses"][rows_, lengths - 1]
    assert ((last == eos) | (lengths == cfg.data.max_response_length)).all()
    before_last = (torch.arange(resp_len) < (lengths - 1)[:, None]) & (t["responses"] == eos)
    assert not before_last.any(), "a response continues after <|im_end|>"
    # per-token fields are zero outside the mask
    for key in ("advantages", "rollout_log_probs", "token_level_scores", "returns"):
        assert (t[key][mask == 0] == 0).all(), key
    old = t["old_log_probs"]
    assert torch.isfinite(old).all() and (old[mask == 1] <= 0).all()
    # the rollout sampled with exactly the actor's weights (synced after every update)
    torch.testing.assert_close(t["rollout_log_probs"][mask == 1], old[mask == 1], atol=2e-4, rtol=0)
    # the score sits on the last response token
    scores = t["token_level_scores"]
    on_last = torch.zeros_like(scores, dtype=torch.bool)
    on_last[rows_, lengths - 1] = True
    assert (scores[~on_last] == 0).all()
    assert list(batch.non_tensor_batch["data_source"]) == ["digits"] * size


def check_group_advantages(batch: DataProto) -> None:
    """GRPO: (score - group mean) / (unbiased group std + 1e-6) on every response token."""
    t = batch.batch
    scores = t["token_level_rewards"].sum(-1).double()
    uids = list(batch.non_tensor_batch["uid"])
    expected = torch.empty_like(scores)
    for uid in set(uids):
        rows = torch.tensor([i for i, u in enumerate(uids) if u == uid])
        group = scores[rows]
        expected[rows] = (group - group.mean()) / (group.std() + 1e-6)
    mask = t["response_mask"].bool()
    want = expected[:, None].expand_as(mask)[mask].float()
    torch.testing.assert_close(t["advantages"][mask], want, atol=1e-4, rtol=1e-5)


def score_rise(history: list[dict[str, float]]) -> tuple[float, float]:
    scores = [h["critic/score/mean"] for h in history if "critic/score/mean" in h]
    print("mean score per step:", [round(s, 3) for s in scores])
    assert len(scores) == 10
    return sum(scores[:2]) / 2, sum(scores[-3:]) / 3


def test_grpo_learns_and_keeps_its_checkpoints_atomic(ray_cluster, make_config, tmp_path):
    out = tmp_path / "grpo"
    config = make_config(
        "grpo",
        [
            "trainer.save_every=5",
            "trainer.max_checkpoints=1",
            "trainer.val_every=5",
            "trainer.val_before_train=true",
            "reward.num_workers=1",  # scored in a worker process
        ],
        output_dir=out,
    )
    with running(config) as trainer:
        assert trainer.groups.dp_size == 2 and trainer.groups.uses_reference  # k3 KL loss
        history = trainer.fit()
        assert [h["step"] for h in history] == list(range(11))
        assert len(trainer.updates) == 10
        for batch in (trainer.updates[0], trainer.updates[-1]):
            check_layout(batch, trainer, rows=4 * 4)
            check_group_advantages(batch)
            t = batch.batch
            torch.testing.assert_close(
                t["token_level_scores"].sum(-1).double(),
                expected_scores(batch, trainer.tokenizer, "compute_score", None),
                atol=1e-6,
                rtol=0,
            )
            assert torch.equal(t["token_level_rewards"], t["token_level_scores"])  # no KL reward
            assert list(batch.non_tensor_batch["uid"])[::4] == list(
                dict.fromkeys(batch.non_tensor_batch["uid"])
            )
        # the reference is the initial policy: before the first update it equals the actor
        first = trainer.updates[0].batch
        mask = first["response_mask"].bool()
        torch.testing.assert_close(
            first["ref_log_prob"][mask], first["old_log_probs"][mask], atol=1e-5, rtol=0
        )
        last = trainer.updates[-1].batch
        assert (last["ref_log_prob"] - last["old_log_probs"])[
            last["response_mask"].bool()
        ].abs().max() > 1e-3

        start, end = score_rise(history)
        assert end > start + 0.15, f"mean score {start:.3f} -> {end:.3f}"
        for step in (0, 5, 10):
            assert 0.0 <= history[step]["val/score"] <= 1.0
        assert history[1]["actor/num_updates"] == 2.0  # two mini-batches per step
        assert history[-1]["training/epoch"] == 1.0  # 10 batches of 4 over 32 prompts

        # checkpoints: only the newest is kept, each complete, `latest` points to it
        root = out / "checkpoints"
        assert sorted(p.name for p in root.iterdir()) == ["latest", "step_10"]
        assert (root / "latest").read_text() == "step_10"
        state = json.loads((root / "step_10" / "trainer_state.json").read_text())
        assert state["global_step"] == 10
        assert state["dataloader"]["epoch"] * 8 + state["dataloader"]["position"] == 10
        assert (root / "step_10" / "actor" / "meta.json").is_file()
        verify_manifest(root / "step_10")  # the trainer's manifest covers the engine's
        assert not (root / "step_10" / "critic").exists()
        assert (out / "metrics.png").read_bytes()[:4] == b"\x89PNG"
        assert len((out / "metrics.jsonl").read_text().splitlines()) == 11

        # a checkpoint write that dies midway never becomes `latest`
        trainer.train_step()
        save = trainer.groups.actor.save_checkpoint

        def dies_midway(path: str) -> None:
            Path(path).mkdir(parents=True)
            (Path(path) / "half-written").write_text("")
            raise RuntimeError("killed while writing the checkpoint")

        trainer.groups.actor.save_checkpoint = dies_midway
        with pytest.raises(CheckpointError, match=r"killed.*kept the earlier checkpoints: step_10"):
            trainer.save_checkpoint()
        assert not (root / ".step_11.partial").exists()  # the staging directory is removed
        assert not (root / "step_11").exists()
        assert (root / "latest").read_text() == "step_10"
        assert find_resume_checkpoint(root, "latest") == root / "step_10"
        trainer.groups.actor.save_checkpoint = save
        assert trainer.save_checkpoint() == root / "step_11"
        assert sorted(p.name for p in root.iterdir()) == ["latest", "step_11"]
        assert (root / "latest").read_text() == "step_11"


def test_dapo_dynamic_sampling_engages_and_learns(ray_cluster, make_config, tmp_path):
    # a sparse reward: most groups of the untrained model score the same for every sample
    config = make_config("dapo", ["reward.function_name=starts_with_target"], tmp_path / "dapo")
    assert config.algorithm.dynamic_sampling.enabled and config.algorithm.overlong.enabled
    with running(config) as trainer:
        assert not trainer.groups.uses_reference  # DAPO drops the KL term
        history = trainer.fit()
        rounds = [h["dapo/gen_rounds"] for h in history]
        dropped = [h["dapo/groups_seen"] - h["dapo/groups_kept"] for h in history]
        assert max(rounds) > 1 and sum(dropped) > 0, (rounds, dropped)
        for h in history:
            assert h["dapo/groups_kept"] >= 4 and h["dapo/partial_batch"] == 0.0
            assert h["dapo/groups_seen"] == 4 * h["dapo/gen_rounds"]
        for batch in trainer.updates:
            # exactly train_batch_size groups, each with a spread of scores
            check_layout(batch, trainer, rows=4 * 4)
            scores = batch.batch["token_level_scores"].sum(-1)
            uids = list(batch.non_tensor_batch["uid"])
            assert len(set(uids)) == 4
            for uid in set(uids):
                group = scores[[i for i, u in enumerate(uids) if u == uid]]
                assert group.max() > group.min()
        batch = trainer.updates[0]
        check_group_advantages(batch)
        torch.testing.assert_close(
            batch.batch["token_level_scores"].sum(-1).double(),
            expected_scores(batch, trainer.tokenizer, "starts_with_target", overlong=2),
            atol=1e-6,
            rtol=0,
        )
        start, end = score_rise(history)
        assert end > start + 0.4, f"mean score {start:.3f} -> {end:.3f}"


def test_gspo_learns(ray_cluster, make_config, tmp_path):
    config = make_config("gspo", output_dir=tmp_path / "gspo")
    assert config.actor.loss.name == "gspo"
    with running(config) as trainer:
        history = trainer.fit()
        for batch in (trainer.updates[0], trainer.updates[-1]):
            check_layout(batch, trainer, rows=4 * 4)
            check_group_advantages(batch)
        # the sequence-level ratio is clipped at 3e-4/4e-4: the second mini-batch of a step
        # (after one optimizer step) is clipped, the first (on-policy) never
        assert 0 < history[-1]["actor/pg_clipfrac"] < 1
        start, end = score_rise(history)
        assert end > start + 0.15, f"mean score {start:.3f} -> {end:.3f}"


def test_ppo_with_a_critic_learns(ray_cluster, make_config, tmp_path):
    out = tmp_path / "ppo"
    config = make_config(
        "ppo",
        [
            "critic.optim.lr=1e-2",
            "data.train_batch_size=8",
            "actor.mini_batch_size=4",
            "trainer.save_every=10",
        ],
        output_dir=out,
    )
    assert config.uses_critic and config.rollout.n == 1
    with running(config) as trainer:
        assert trainer.groups.critic is not None
        history = trainer.fit()
        for batch in (trainer.updates[0], trainer.updates[-1]):
            check_layout(batch, trainer, rows=8)
            t = batch.batch
            mask = t["response_mask"].bool()
            assert t["values"].shape == mask.shape and torch.isfinite(t["values"]).all()
            score = t["token_level_rewards"].sum(-1, keepdim=True).expand_as(mask)
            # gamma = lam = 1 and the reward on the last token: every return is the score
            torch.testing.assert_close(t["returns"][mask], score[mask], atol=1e-5, rtol=0)
            # GAE advantages = score - value, whitened over the batch's response tokens
            raw = (score - t["values"]).double()[mask]
            want = (raw - raw.mean()) / raw.std()
            torch.testing.assert_close(t["advantages"][mask].double(), want, atol=1e-4, rtol=0)
        assert all(h["critic/num_updates"] == 2.0 for h in history)
        assert history[-1]["critic/vf_loss"] < history[0]["critic/vf_loss"]
        start, end = score_rise(history)
        assert end > start + 0.15, f"mean score {start:.3f} -> {end:.3f}"
        step = out / "checkpoints" / "step_10"
        assert (step / "critic" / "meta.json").is_file() and (
            step / "actor" / "meta.json"
        ).is_file()

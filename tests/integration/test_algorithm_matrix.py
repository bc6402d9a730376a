"""Every estimator, policy loss, KL kind and aggregation added by issue 17 (and ReMax)
trains `examples/grpo_tiny.yaml` for 2 steps.

The runs use the in-process `local` backend (one FSDP worker with its `hf` rollout, no Ray)
and in-process rewards, so the whole matrix stays within a few minutes on 2 CPUs. The
reward is `spread_reward.py` so that groups differ and advantages are not all zero. Each
run (2 mini-batches per step, so the second one trains off the old policy) checks the
2 steps' metrics, that the actor's weights moved, and what the name
selects: the advantages of the recorded update batch against an independent computation
for the estimators, and the loss's own metric or setting for the losses.
"""

from __future__ import annotations

import math
import runpy
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from rl_algos.config import load_config
from rl_algos.trainer.loop import RLTrainer
from rl_core.protocol import DataProto

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "grpo_tiny.yaml"
REWARD = Path(__file__).resolve().parent / "spread_reward.py"

CASES = {
    # advantage estimators
    "opo": ["algorithm.adv_estimator=opo"],
    "gpg": ["algorithm.adv_estimator=gpg"],
    "grpo_passk": ["algorithm.adv_estimator=grpo_passk"],
    "remax": ["algorithm.adv_estimator=remax"],
    # policy losses
    **{
        f"loss-{name}": [f"actor.loss.name={name}"]
        for name in ("clip_cov", "kl_cov", "gpg", "geo_mean", "cispo", "sapo")
    },
    **{f"loss-{name}": [f"actor.loss.name={name}"] for name in ("dppo_tv", "dppo_kl", "dro")},
    "loss-reinforce": ["actor.loss.name=reinforce"],
    # KL kinds (the grpo preset of the example has a KL loss term)
    **{f"kl-{kind}": [f"actor.loss.kl_loss_type={kind}"] for kind in ("k1+", "k3+", "low_var_kl+")},
    # aggregation
    "agg-token-sum": ["actor.loss.agg_mode=token-sum"],
}
# make Clip-Cov / KL-Cov act on this tiny batch: a share and window that select tokens
CASES["loss-clip_cov"] += ["actor.loss.clip_cov_ratio=0.2", "actor.loss.clip_cov_lb=-100"]
CASES["loss-kl_cov"] += ["actor.loss.kl_cov_ratio=0.2"]


def run_two_steps(overrides: list[str], output_dir: Path):
    cfg = load_config(
        EXAMPLE,
        [
            *overrides,
            f"trainer.output_dir={output_dir}",
            "trainer.backend=local",
            "trainer.num_workers=1",
            "trainer.val_every=0",
            "trainer.save_every=0",
            "trainer.val_before_train=false",
            "trainer.loggers=[jsonl]",
            "reward.num_workers=0",
            f"reward.function_path={REWARD}",
            # two optimizer steps per step: the second mini-batch sees ratios != 1, so the
            # clips, gates and trust regions act (and old log-probs are recomputed)
            "actor.mini_batch_size=2",
        ],
    )
    trainer = RLTrainer(cfg)
    updates: list[DataProto] = []
    group = trainer.groups.actor
    update_actor = group.update_actor

    before: list[torch.Tensor] = []
    generate = group.generate_sequences
    greedy: list[DataProto] = []

    def recording_generate(batch: DataProto) -> DataProto:
        out = generate(batch)
        if batch.meta_info.get("temperature") == 0.0:
            greedy.append(out)
        return out

    group.generate_sequences = recording_generate

    def recording_update_actor(batch: DataProto) -> DataProto:
        updates.append(batch)
        if not before:  # the policy's log-probs of the first batch before any update
            before.append(group.compute_log_prob(batch).batch["old_log_probs"])
        return update_actor(batch)

    group.update_actor = recording_update_actor
    try:
        history = trainer.fit()
        # the first update batch under the trained weights: its log-probs must have moved
        first = updates[0]
        now = group.compute_log_prob(first).batch["old_log_probs"]
        mask = first.batch["response_mask"].bool()
        moved = float((now - before[0])[mask].abs().max())
        tokenizer = trainer.tokenizer
    finally:
        trainer.close()
    return cfg, history, updates, moved, greedy, tokenizer


def per_sample(tensor: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """The one value each row carries on its response tokens (outcome estimators)."""
    out = []
    for row, m in zip(tensor, mask):
        values = row[m.bool()].tolist()
        assert values == pytest.approx([values[0]] * len(values), rel=1e-6, abs=1e-6)
        out.append(values[0])
    return out


def expected_advantages(name: str, batch: DataProto) -> list[float]:
    """Each row's advantage from the papers' formulas, in plain Python."""
    t = batch.batch
    mask = t["response_mask"]
    scores = t["token_level_rewards"].sum(-1).double().tolist()
    lengths = mask.sum(-1).tolist()
    uids = batch.non_tensor_batch["uid"].tolist()
    if name == "remax":
        return [s - b for s, b in zip(scores, t["reward_baselines"].double().tolist())]
    groups = defaultdict(list)
    for i, u in enumerate(uids):
        groups[u].append(i)
    out = [0.0] * len(scores)
    nonzero = max(sum(s != 0 for s in scores), 1)
    for rows in groups.values():
        vals = [scores[i] for i in rows]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        if name == "opo":
            b = sum(lengths[i] * scores[i] for i in rows) / sum(lengths[i] for i in rows)
            for i in rows:
                out[i] = scores[i] - b
        elif name == "gpg":
            for i in rows:
                out[i] = len(scores) / nonzero * (scores[i] - mean)
        else:  # grpo_passk
            best, second = sorted(rows, key=lambda i: -scores[i])[:2]
            if scores[best] != scores[second]:
                out[best] = (scores[best] - scores[second]) / (std + 1e-6)
    return out


def check_remax_baselines(updates, greedy, tokenizer) -> None:
    """One greedy rollout per step with one response per prompt, and each sampled row's
    baseline is its prompt's greedy response scored by the reward, from the decoded text."""
    reward = runpy.run_path(str(REWARD))["compute_score"]
    assert len(greedy) == 2  # one per step (validation is off)
    for batch, out in zip(updates, greedy):
        uids = out.non_tensor_batch["uid"].tolist()
        assert sorted(uids) == sorted(set(batch.non_tensor_batch["uid"].tolist()))
        prompt_len = out.batch["prompts"].shape[-1]
        lengths = out.batch["attention_mask"][:, prompt_len:].sum(-1).tolist()
        score = {}
        for uid, ids, n in zip(uids, out.batch["responses"], lengths):
            text = tokenizer.decode(ids[: int(n)].tolist(), skip_special_tokens=True)
            score[uid] = reward("arithmetic", text, "", {})
        expected = [score[u] for u in batch.non_tensor_batch["uid"].tolist()]
        assert batch.batch["reward_baselines"].tolist() == pytest.approx(expected)


@pytest.mark.parametrize("case", list(CASES))
def test_trains_grpo_tiny_for_two_steps(case, tmp_path):
    cfg, history, updates, moved, greedy, tokenizer = run_two_steps(CASES[case], tmp_path / case)
    assert [h["step"] for h in history] == [1, 2]
    for h in history:
        bad = {k: v for k, v in h.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, f"non-finite metrics: {bad}"
        assert "actor/pg_loss" in h
    assert len(updates) == 2
    assert all("old_log_probs" in set(b.batch.keys()) for b in updates)
    assert all(h["actor/num_updates"] == 2.0 for h in history)
    assert moved > 1e-6, "the actor's weights did not change"

    if case in ("opo", "gpg", "grpo_passk", "remax"):
        assert cfg.algorithm.adv_estimator == case
        for batch in updates:
            mask = batch.batch["response_mask"]
            got = per_sample(batch.batch["advantages"].double(), mask)
            assert got == pytest.approx(expected_advantages(case, batch), rel=1e-5, abs=1e-6)
            assert (batch.batch["advantages"][mask == 0] == 0).all()
        if case == "remax":
            assert "reward/baseline_mean" in history[0]
            check_remax_baselines(updates, greedy, tokenizer)
        else:
            assert any(
                abs(a) > 0 for b in updates for a in b.batch["advantages"].flatten().tolist()
            )
    elif case.startswith("loss-"):
        assert cfg.actor.loss.name == case.removeprefix("loss-")
        if case == "loss-clip_cov":
            assert any(h["actor/clip_cov_frac"] > 0 for h in history)
        if case == "loss-kl_cov":
            assert all(h["actor/kl_cov_frac"] > 0 for h in history)
    elif case.startswith("kl-"):
        assert cfg.actor.loss.kl_loss_type == case.removeprefix("kl-")
        assert cfg.actor.loss.kl_loss_coef > 0 and "actor/kl_loss" in history[0]
    else:
        assert cfg.actor.loss.agg_mode == "token-sum"

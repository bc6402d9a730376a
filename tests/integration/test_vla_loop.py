"""VLA episodes through the one trainer loop (`examples/grpo_vla_reach.yaml`, made small):
what the shared loop gives every episode source, checked on VLA runs.

* Reference + KL: the reference policy's log-probs are the initial policy's (a plain
  `VLAPolicy` built from the same config, no engine), the trained actor's differ, the KL
  loss is logged and grows from 0; the rollout acts with the trained weights (its
  log-probs equal the actor's after the sync).
* Async with a staleness bound (Ray): ``async.max_staleness=1`` trains batches generated
  one version ahead, never more.
* Faults (``tests-faults``): an env worker that hangs (SIGSTOP, ``env.step_timeout_s``)
  and one killed with SIGKILL fail their half's episodes, which are dropped and counted
  (``env/failed_episodes``) while the half is replaced; a training worker killed with
  SIGKILL during an update fails over (``trainer.max_restarts: 1``) and every step is
  logged once, ``trainer/restarts`` among the metrics.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from rl_algos.config import load_config
from rl_algos.trainer.loop import RLTrainer
from rl_algos.trainer.tracking import read_jsonl

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_vla_reach.yaml"
SMALL = [
    "vla.groups=2",
    "rollout.n=4",
    "vla.max_steps=3",
    "vla.val_episodes=4",
    "vla.frames=false",
    "env.options.image_size=56",
    "trainer.loggers=[jsonl]",
    "trainer.val_every=0",
    "trainer.save_every=0",
]


def _config(out: Path, *overrides: str):
    return load_config(str(EXAMPLE), [*SMALL, f"trainer.output_dir={out}", *overrides])


def test_vla_reference_policy_and_kl_loss(tmp_path):
    from rl_algos.trainer.vla_episodes import vla_policy_options
    from rl_core.engine import ModelConfig
    from rl_multimodal.vla.engine_model import build_vla_policy

    # one optimizer step per training step: step 1's update starts from the reference
    cfg = _config(tmp_path, "trainer.backend=local", "trainer.total_steps=2", "actor.epochs=1",
                  "actor.loss.kl_loss_coef=0.1", "trainer.val_before_train=false")  # fmt: skip
    trainer = RLTrainer(cfg)
    try:
        assert trainer.groups.uses_reference
        history = trainer.fit()
        batch, _ = trainer.env_source.play(trainer.rollout, 7)
        batch.meta_info["temperature"] = 1.0
        ref = trainer.groups.actor.compute_ref_log_prob(batch).batch["ref_log_prob"]
        actor = trainer.groups.actor.compute_log_prob(batch).batch["old_log_probs"]
        path = trainer.model_path
    finally:
        trainer.close()
    assert [h["step"] for h in history] == [1, 2]
    kl = [h["actor/kl_loss"] for h in history]
    assert kl[0] == pytest.approx(0.0, abs=1e-7) and kl[1] > 1e-4, kl  # then it moved away
    options = vla_policy_options(cfg)
    initial = build_vla_policy(ModelConfig(path=path, builder="vla", builder_options=options), 0)
    with torch.no_grad():
        expected = initial.eval()(batch, ("log_probs",))["log_probs"]
    torch.testing.assert_close(ref, expected, rtol=0, atol=1e-5)  # the frozen initial policy
    assert (actor - expected).abs().max() > 1e-3  # the trained one is another
    # the rollout acted with the trained weights (synced after the update, fp32)
    torch.testing.assert_close(batch.batch["rollout_log_probs"], actor, rtol=0, atol=1e-5)


@pytest.mark.ray
def test_vla_async_trains_batches_at_most_one_version_stale(ray_cluster, tmp_path):
    cfg = _config(tmp_path, "trainer.total_steps=4", "async.max_staleness=1")
    trainer = RLTrainer(cfg)
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    rows = [h for h in history if h["step"] > 0]
    assert [h["step"] for h in rows] == [1, 2, 3, 4]
    assert all(h["async/staleness/max"] <= 1 for h in rows)
    assert any(h["async/staleness/hist_1"] > 0 for h in rows), rows  # generated ahead
    assert all("train/success_rate" in h and h["trainer/restarts"] == 0 for h in rows)


@pytest.mark.ray
@pytest.mark.faults
def test_vla_env_hang_and_kills_are_dropped_counted_and_failed_over(
    ray_cluster, tmp_path, kill_once
):
    import ray

    cfg = _config(tmp_path, "trainer.total_steps=5", "trainer.max_restarts=1",
                  "trainer.restart_backoff_s=0", "env.step_timeout_s=8",
                  "env.max_failure_fraction=0.5")  # fmt: skip
    trainer = RLTrainer(cfg)
    envs = trainer.env_source.envs
    train_step, armed = trainer.train_step, []

    def pid(group) -> int:
        return ray.get(group.workers[0].ping.remote())

    def step_with_faults() -> dict[str, float]:
        step = trainer.global_step + 1
        if step == 2 and step not in armed:  # env worker of half 1 hangs mid-step
            kill_once(envs.halves[1], "step", pid(envs.halves[1]), signal.SIGSTOP)
        elif step == 3 and step not in armed:  # env worker of half 0 killed mid-step
            kill_once(envs.halves[0], "step", pid(envs.halves[0]))
        elif step == 4 and step not in armed:  # the training worker killed mid-update
            kill_once(trainer.groups.actor, "update_actor", pid(trainer.groups.actor))
        armed.append(step)
        return train_step()

    trainer.train_step = step_with_faults
    try:
        trainer.fit()
    finally:
        trainer.close()
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # each once
    assert [r["trainer/restarts"] for r in rows] == [0, 0, 0, 1, 1]
    assert rows[3]["failover/restored_step"] == 3 and rows[3]["failover/from_snapshot"] == 1
    half = cfg.vla.groups * cfg.rollout.n / 2
    failed = [r["env/failed_episodes"] for r in rows]
    assert failed == [0, half, half, 0, 0], failed  # the hung half, then the killed one
    assert all(r["env/episodes"] == 2 * half for r in rows)
    assert rows[1]["train/success_rate"] >= 0  # the other half's episodes trained

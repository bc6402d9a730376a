"""On-policy steps without the separate old-log-prob pass, and entropy in the update.

When the batch makes exactly one optimizer step from the weights that generated it, the
old log-probs equal the update's own log-probs, detached: the trainer skips the no-grad
pass. These tests pin that the shortcut changes nothing (same loss, same gradient norm,
same updated weights as with the separate pass), that the trainer takes it only when it
cannot change the result, and that `entropy_coeff > 0` trains and logs `actor/entropy`.
"""

from __future__ import annotations

import pytest
import torch

from rl_algos.config import load_config
from rl_algos.losses import PolicyLossConfig, make_actor_loss_fn
from rl_algos.trainer.loop import RLTrainer
from rl_algos.trainer.placement import recomputes_old_log_probs
from rl_core.engine import build_engine
from rl_core.testing.train_engine import engine_config, make_rl_batch, save_tiny_model


def _weights(engine) -> dict[str, torch.Tensor]:
    return {n: t.clone() for b in engine.export_weights() for n, t in b}


@pytest.mark.parametrize("entropy_coeff", [0.0, 0.01])
def test_shortcut_gives_identical_losses_gradients_and_weights(tmp_path, entropy_coeff):
    model_dir = save_tiny_model(str(tmp_path / "lm"), "qwen2")
    options = {"micro_batch": {"micro_batch_size": 3}, "infer_micro_batch": {"micro_batch_size": 3}}
    cfg = engine_config(model_dir, options, optim={"lr": 1e-2, "grad_clip": 1.0})
    loss_fn = make_actor_loss_fn(PolicyLossConfig(entropy_coeff=entropy_coeff))
    outputs = ("log_probs", "entropy")
    batch = make_rl_batch(num_seqs=8)

    separate = build_engine("fsdp", cfg)
    with_pass = batch.union(_renamed(separate.infer_batch(batch, outputs=("log_probs",))))
    m_pass = separate.train_batch(with_pass, loss_fn, outputs=outputs)
    w_pass = _weights(separate)
    separate.close()

    shortcut = build_engine("fsdp", cfg)
    on_policy = batch.select(batch_keys=list(batch.batch.keys()))
    on_policy.meta_info["old_log_probs_from_update"] = True
    m_short = shortcut.train_batch(on_policy, loss_fn, outputs=outputs)
    w_short = _weights(shortcut)
    shortcut.close()

    for key in ("loss", "grad_norm", "actor/pg_loss", "actor/entropy"):
        assert m_short[key] == pytest.approx(m_pass[key], rel=1e-6, abs=1e-9), key
    assert m_short["grad_norm"] > 0
    for name, tensor in w_pass.items():
        torch.testing.assert_close(w_short[name], tensor, rtol=0, atol=1e-7)


def _renamed(out):
    from rl_core.protocol import DataProto

    return DataProto.from_dict({"old_log_probs": out.batch["log_probs"]})


def test_the_trainer_skips_the_pass_only_when_it_cannot_change_the_result():
    def cfg(*overrides):
        raw = {"model": {"path": "tiny-random:qwen2"}, "data": {"generate": {"task": "arithmetic"}}}
        return load_config(raw, list(overrides))

    one_step = ("data.train_batch_size=4", "actor.mini_batch_size=4")
    assert not recomputes_old_log_probs(cfg(*one_step))
    assert recomputes_old_log_probs(cfg(*one_step, "actor.epochs=2"))
    assert recomputes_old_log_probs(cfg("data.train_batch_size=8", "actor.mini_batch_size=4"))
    assert recomputes_old_log_probs(cfg(*one_step, "algorithm.use_kl_in_reward=true"))
    assert recomputes_old_log_probs(cfg(*one_step, "actor.recompute_old_log_probs=true"))
    assert recomputes_old_log_probs(cfg(*one_step, "async.max_staleness=1"))
    assert not recomputes_old_log_probs(
        cfg("data.train_batch_size=8", "actor.recompute_old_log_probs=false")
    )


@pytest.mark.slow
@pytest.mark.ray
def test_entropy_bonus_trains_on_policy_and_logs_entropy(ray_cluster, make_config, tmp_path):
    config = make_config(
        "grpo",
        [
            "actor.mini_batch_size=4",  # one optimizer step per RL step: the shortcut
            "actor.loss.entropy_coeff=0.01",
            "trainer.total_steps=2",
        ],
        output_dir=tmp_path / "entropy",
    )
    trainer = RLTrainer(config)
    try:
        assert not trainer.recompute_old_log_probs
        history = trainer.fit()
    finally:
        trainer.close()
    assert len(history) == 2
    for metrics in history:
        assert "timing/old_log_prob_s" not in metrics, metrics.keys()
        entropy = metrics["actor/entropy"]
        assert 0 < entropy < torch.log(torch.tensor(512.0)).item(), entropy
        assert metrics["actor/grad_norm"] > 0


@pytest.mark.slow
@pytest.mark.ray
def test_hybrid_engine_cycle_sleeps_the_rollout_while_training(ray_cluster, make_config, tmp_path):
    """With `rollout.sleep_while_training` (the accelerator default) the rollout sleeps
    after generating and wakes at the weight sync; a missed wake-up would hang generation
    (the HF engine holds new batches until `wake_up`), and validation generates too."""
    config = make_config(
        "grpo",
        [
            "rollout.sleep_while_training=true",
            "trainer.total_steps=2",
            "trainer.val_every=2",
            "trainer.call_timeout_s=240",
        ],
        output_dir=tmp_path / "sleep",
    )
    trainer = RLTrainer(config)
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    assert len(history) == 2 and all(m["actor/grad_norm"] > 0 for m in history)


def test_precision_and_placement_fields_reach_the_workers():
    """Master weights stay fp32 while compute and rollout dtypes are separate fields; the
    reference model is inference-only (no AdamW state)."""
    from rl_algos.trainer.placement import actor_worker_config

    raw = {"model": {"path": "tiny-random:qwen2"}, "data": {"generate": {"task": "arithmetic"}}}
    overrides = [
        "model.compute_dtype=bfloat16",
        "rollout.dtype=bfloat16",
        "rollout.gpu_memory_utilization=0.4",
        "model.attn_implementation=eager",
        "model.use_remove_padding=true",
        "actor.engine_kwargs={logprob_chunk_tokens: 512}",
        "actor.loss.kl_loss_coef=0.001",
        "trainer.platform=cpu",
        "trainer.gpus_per_worker=0",
    ]
    cfg = load_config(raw, overrides)
    worker = actor_worker_config(cfg, "/models/m", pad_token_id=0)
    model = worker["engine_config"]["model"]
    assert (model["dtype"], model["compute_dtype"]) == ("float32", "bfloat16")
    assert "attn_implementation" not in model and "use_remove_padding" not in model
    # the model section's fsdp options reach the engine's own options, beside the role's
    assert worker["engine_config"]["engine_kwargs"] == {
        "attn_implementation": "eager",
        "use_remove_padding": True,
        "logprob_chunk_tokens": 512,
    }
    assert worker["rollout"]["rollout"]["dtype"] == "bfloat16"
    assert worker["rollout"]["rollout"]["engine_kwargs"] == {"gpu_memory_utilization": 0.4}
    ref = worker["ref"]
    assert ref["inference_only"] is True and ref["optim"] == {"lr": 0.0}
    assert ref["model"]["compute_dtype"] == "bfloat16"
    assert cfg.trainer.platform == "cpu" and cfg.trainer.gpus_per_worker == 0


def test_bf16_compute_keeps_fp32_master_weights_on_cpu(tmp_path):
    model_dir = save_tiny_model(str(tmp_path / "lm"), "llama")
    cfg = engine_config(model_dir, {"model": {"compute_dtype": "bfloat16"}})
    engine = build_engine("fsdp", cfg)
    assert engine.compute_dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in engine.model.parameters())
    batch = make_rl_batch()
    from rl_core.testing.train_engine import pg_loss

    before = _weights(engine)
    metrics = engine.train_batch(batch, pg_loss)
    after = _weights(engine)
    assert metrics["grad_norm"] > 0
    assert all(t.dtype == torch.float32 for t in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before)
    states = [t for s in engine.optimizer.state.values() for t in s.values() if t.dim() > 0]
    assert states and all(t.dtype == torch.float32 for t in states)
    engine.close()

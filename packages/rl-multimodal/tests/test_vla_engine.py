"""The VLA policy trains through the fsdp engine; `rl train` on VLA configs (the one trainer
loop): resume, export, LoRA, gae refused, the local backend.

References: a plain `VLAPolicy` trained by hand (the same loss, AdamW, clipping) for the
engine's update; the uninterrupted run for resume; a policy loaded from `rl export`'s
directory, playing the validation episodes on its own, for the export.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rl_algos.losses import PolicyLossConfig, make_actor_loss_fn
from rl_algos.trainer.vla_episodes import Episodes, _Step, observations_proto, steps_to_batch
from rl_core.engine import EngineConfig, LossContext, ModelConfig, OptimizerConfig, build_engine
from rl_multimodal.vla.engine_model import build_vla_policy
from rl_multimodal.vla.envs import ReachConfig, ReachEnv
from rl_multimodal.vla.rollout import act_on
from rl_multimodal.vlm.tiny import resolve_tiny_vlm

EXAMPLE = Path(__file__).parents[3] / "examples" / "grpo_vla_reach.yaml"
REACH = ReachConfig(image_size=56, max_steps=6, n_directions=4)


def _options(head: str = "tokens") -> dict:
    spec = ReachEnv(1, REACH).action_spec
    return {
        "head": head, "n_bins": 3, "image_grid": 2, "freeze_vision": True,
        "action_low": spec.low.tolist(), "action_high": spec.high.tolist(), "max_chunk": 1,
    }  # fmt: skip


def _model_config(head: str = "tokens") -> ModelConfig:
    return ModelConfig(
        path=resolve_tiny_vlm("qwen2_5_vl"), builder="vla", builder_options=_options(head)
    )


def _rows(policy, n: int):
    """The training rows of one policy step on `n` reach envs, as the VLA source builds them."""
    env = ReachEnv(n, REACH)
    torch.manual_seed(1)
    obs = env.reset(list(range(n)))
    out = act_on(policy, observations_proto(obs, False))
    ep = Episodes(n, 1)
    ep.steps.append(_Step(0, np.arange(n), out, obs.images, obs.instructions))
    return obs, out, steps_to_batch(ep, np.arange(n), pad_id=0)


def _batch(policy):
    """A training batch of one policy step on 4 reach envs (advantages given)."""
    _, _, batch = _rows(policy, 4)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None]
    batch.batch["advantages"] = adv.expand_as(batch.batch["response_mask"]).contiguous()
    batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
    return batch


@pytest.mark.parametrize("head", ["tokens", "gaussian"])
def test_engine_update_equals_a_plain_policy_trained_by_hand(head):
    """One train_batch of the fsdp engine over the VLA policy == the same loss, backward,
    clipping and AdamW step on a plain (unsharded) copy of the policy."""
    torch.manual_seed(0)
    lr, clip = 1e-2, 0.5
    engine = build_engine(
        "fsdp",
        EngineConfig(
            model=_model_config(head),
            optim=OptimizerConfig(lr=lr, weight_decay=0.0, grad_clip=clip),
            timeout_s=120.0,
        ),
    )
    plain = build_vla_policy(_model_config(head), 0)
    plain.load_state_dict({n: t for b in engine.export_weights() for n, t in b}, strict=True)
    before = {n: p.detach().clone() for n, p in plain.named_parameters()
              if n.startswith(("model.model.visual.", "image_adapter."))}  # fmt: skip
    batch = _batch(plain)
    loss_fn = make_actor_loss_fn(PolicyLossConfig(agg_norm_constant=1.0))
    metrics = engine.train_batch(batch, loss_fn, outputs=("log_probs", "entropy", "values"))
    assert metrics["num_seqs"] == 4 and metrics["grad_norm"] > 0

    params = [p for p in plain.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    n_tok = int(batch.batch["response_mask"].sum())
    ctx = LossContext(n_tok, 4, 1, 0, 1, 1.0)
    out = plain(batch, ("log_probs", "entropy", "values"), 1.0)
    loss, _ = loss_fn(out, batch, ctx)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(params, clip)
    optim.step()
    assert metrics["grad_norm"] == pytest.approx(float(norm), rel=1e-4)
    trained = {n: t for b in engine.export_weights() for n, t in b}
    for name, p in plain.named_parameters():
        torch.testing.assert_close(trained[name], p.detach(), rtol=1e-5, atol=1e-6)
    # the frozen tower stays as it was; the (zero-initialised) image adapter trains
    for name, t in before.items():
        moved = not torch.equal(trained[name], t)
        assert moved == name.startswith("image_adapter."), name
    assert not any(
        n.startswith("model.model.visual") and p.requires_grad for n, p in plain.named_parameters()
    )
    engine.close()


def _run(tmp: Path, *overrides: str) -> int:
    from rl_algos.cli import main

    return main(["train", str(EXAMPLE), "trainer.backend=local", f"trainer.output_dir={tmp}",
                 "trainer.total_steps=3", "trainer.val_every=3", "trainer.save_every=1",
                 "trainer.loggers=[jsonl]", "vla.groups=2", "vla.val_episodes=4", "vla.frames=false",
                 "vla.max_steps=3", "env.options.image_size=56", *overrides])  # fmt: skip


def _jsonl(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_rl_train_vla_resumes_exactly_and_exports_a_policy_that_acts_the_same(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    # the cosine schedule's length fixed: unset, it follows trainer.total_steps (1 vs 3 here)
    schedule = "actor.optim.total_steps=12"
    assert _run(full, schedule) == 0
    assert _run(part, schedule, "trainer.total_steps=1") == 0
    assert _run(part, schedule, "trainer.resume=latest") == 0
    a = {r["step"]: r for r in _jsonl(full)}
    b = {r["step"]: r for r in _jsonl(part)}
    assert a[2]["actor/grad_norm"] > 0  # the resumed run trains at least one step
    for step in (2, 3):  # the resumed steps are the uninterrupted ones
        keys = {k for k in a[step] if not k.startswith(("timing/", "perf/"))}
        assert keys == {k for k in b[step] if not k.startswith(("timing/", "perf/"))}
        for key in keys:
            assert b[step][key] == a[step][key], (step, key)
    from safetensors.torch import load_file  # noqa: F401

    from rl_engines.fsdp import FSDPEngine

    wa = FSDPEngine.read_checkpoint_weights(str(full / "checkpoints/step_3/actor"))
    wb = FSDPEngine.read_checkpoint_weights(str(part / "checkpoints/step_3/actor"))
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name

    from rl_algos.cli import main
    from rl_multimodal.vla import VLAPolicy

    out = tmp_path / "exported"
    assert main(["export", str(full), str(out)]) == 0
    assert (out / "rl_model.json").is_file() and (out / "vla_heads.safetensors").is_file()
    meta = json.loads((out / "rl_model.json").read_text())
    assert (
        meta["action_tokenizer"]["n_bins"] == 3 and len(meta["action_tokenizer"]["token_ids"]) == 3
    )
    policy = VLAPolicy.from_exported(str(out))  # outside the framework: no engine, no worker
    env = ReachEnv(4, ReachConfig(image_size=56, max_steps=6, n_directions=4))
    seeds = list(range(10_000, 10_004))
    obs, done, success, length = env.reset(seeds), np.zeros(4, bool), np.zeros(4, bool), np.zeros(4)
    for _ in range(3):  # vla.max_steps
        act = policy.act(policy.process(obs), greedy=True)
        length += ~done
        res = env.step(act.env_actions)
        success |= res.info["success"]
        done |= res.done
        obs = res.observation
    assert float(success.mean()) == a[3]["val/success_rate"]
    assert float(length.mean()) == a[3]["val/mean_length"]


def test_gae_and_vf_coef_are_refused_in_one_line(tmp_path, capsys):
    """PPO with the policy's value head went with the VLA trainer: the keys fail clearly."""
    assert _run(tmp_path, "algorithm.adv_estimator=gae") == 2
    err = capsys.readouterr().err
    assert "algorithm.adv_estimator" in err and "went with the VLA trainer" in err, err
    assert _run(tmp_path, "vla.vf_coef=0.5") == 2
    assert "vla.vf_coef" in capsys.readouterr().err
    row_columns = {"rollout.guide_prompt_key": "guided_n", "rollout.reference_key": "reference_n"}
    for key, count in row_columns.items():  # a VLA run has no prompt rows to read them from
        assert _run(tmp_path, f"{key}=answer", f"rollout.{count}=1") == 2
        err = capsys.readouterr().err
        assert key in err and "null in a VLA run" in err, err


def test_lora_on_the_vla_policy_trains_adapters_and_heads_and_exports_merged(tmp_path):
    """``model.lora`` in a VLA run: only the adapters (on the language model) and the heads
    train; the export merges the adapters, and the exported policy acts as validated."""
    from rl_algos.cli import main
    from rl_engines.fsdp import FSDPEngine
    from rl_multimodal.vla import VLAPolicy

    run = tmp_path / "run"
    assert _run(run, "model.lora.rank=4", "model.lora.alpha=8",
                "model.lora.target_modules=[q_proj,v_proj]", "trainer.total_steps=2",
                "trainer.save_every=2", "trainer.val_every=2", "actor.optim.lr=5e-2") == 0  # fmt: skip
    rows = _jsonl(run)
    ckpt = str(run / "checkpoints/step_2/actor")
    adapters = FSDPEngine.read_checkpoint_weights(ckpt, merge_lora=False)
    assert adapters and all(".lora_" in k for k in adapters)
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in adapters.items())
    merged = FSDPEngine.read_checkpoint_weights(ckpt)
    assert not any(".lora_" in k or ".base_layer." in k for k in merged)
    base = build_vla_policy(_model_config(), 0).state_dict()
    q = "model.model.language_model.layers.0.self_attn.q_proj.weight"
    mlp = "model.model.language_model.layers.0.mlp.down_proj.weight"
    assert not torch.equal(merged[q], base[q])  # adapted: W + scaling * B @ A
    assert torch.equal(merged[mlp], base[mlp])  # not targeted: frozen
    assert torch.equal(merged["model.lm_head.weight"], base["model.lm_head.weight"])
    assert merged["image_adapter.weight"].abs().sum() > 0  # the heads train as without LoRA

    out = tmp_path / "exported"
    assert main(["export", str(run), str(out)]) == 0
    policy = VLAPolicy.from_exported(str(out))
    assert not any(".lora_" in k for k in policy.state_dict())
    torch.testing.assert_close(policy.state_dict()[q], merged[q])
    env = ReachEnv(4, ReachConfig(image_size=56, max_steps=6, n_directions=4))
    obs, done, success = (
        env.reset(list(range(10_000, 10_004))),
        np.zeros(4, bool),
        np.zeros(4, bool),
    )
    for _ in range(3):  # vla.max_steps
        res = env.step(policy.act(policy.process(obs), greedy=True).env_actions)
        success |= res.info["success"] & ~done
        done |= res.done
        obs = res.observation
    assert float(success.mean()) == rows[-1]["val/success_rate"]


def test_act_sends_no_frames_back_and_each_training_row_carries_its_own():
    """The rollout role's output goes through Ray: it carries no frames (the driver sent
    them and keeps them); each row of the training batch carries its own frame (uint8) and
    instruction, which the update processes again. (Each row's pixel values once were a
    view of the whole batch's, which pickles all of them: 32 rows were 174 MB per call
    instead of 5 MB, and the policy loop ran at 35% of the old runner's speed.)"""
    import pickle

    torch.manual_seed(0)
    policy = build_vla_policy(_model_config(), 0).eval()
    obs, out, batch = _rows(policy, 8)
    assert not out.non_tensor_batch and len(pickle.dumps(out)) < 0.1 * obs.images.nbytes
    rows = batch.non_tensor_batch["multi_modal_inputs"]
    assert all(np.array_equal(r["image"], im) for r, im in zip(rows, obs.images, strict=True))
    assert len(pickle.dumps(rows[:1])) < 1.2 * obs.images[0].nbytes + 200
    # the update's forward gives the act's log-probs from the frames (same pixels)
    batch = _batch(policy)
    with torch.no_grad():
        logp = policy(batch, outputs=("log_probs",))["log_probs"]
    torch.testing.assert_close(logp, batch.batch["old_log_probs"], rtol=0, atol=1e-6)

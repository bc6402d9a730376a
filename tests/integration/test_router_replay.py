"""Router replay (R3) end to end on the tiny Qwen3-MoE.

The rollout (hf backend) runs in bfloat16 and records each token's experts; the trainer
(fsdp engine) runs in float32. Without replay some tokens are routed to other experts than
the rollout chose; with replay the trainer's routing is the rollout's, token for token, and
the log-prob mismatch between rollout and trainer shrinks. The model's weights are drawn at
std 0.1 (the tiny-random default, 0.02, leaves the experts' share of the residual stream too
small for a routing flip to move a log-prob visibly).

Also: `rl train examples/grpo_tiny_moe_replay.yaml` runs, and router replay on a dense model
is refused in one line naming ``actor.router_replay``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl_core.engine import build_engine
from rl_core.protocol import DataProto
from rl_core.rollout import RolloutConfig, build_rollout_engine, build_sequence_generator

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "grpo_tiny_moe_replay.yaml"
RL = Path(sys.executable).with_name("rl")
NUM_PROMPTS = 16
RESPONSE = 16


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> str:
    import transformers

    from rl_algos.trainer.model_source import resolve_model_path

    base = resolve_model_path("tiny-random:qwen3_moe")
    config = transformers.AutoConfig.from_pretrained(base)
    config.initializer_range = 0.1
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out = str(tmp_path_factory.mktemp("moe"))
    model.save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def rollout_batch(moe_dir) -> DataProto:
    """Samples of the bfloat16 hf rollout with the routing it recorded."""
    rollout = {"model_path": moe_dir, "backend": "hf", "dtype": "bfloat16",
               "return_routed_experts": True}  # fmt: skip
    engine = build_rollout_engine(RolloutConfig(**rollout))
    config = {
        "rollout": rollout,
        "placement": "colocated",
        "sampling": {"temperature": 1.0, "max_tokens": RESPONSE},
        "loop": {"response_length": RESPONSE},
        "pad_token_id": 0,
    }
    generator = build_sequence_generator("agent_loop", config, engine=engine)
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(4, 99, (int(torch.randint(8, 24, (1,), generator=g)),), generator=g).tolist()
        for _ in range(NUM_PROMPTS)
    ]
    batch = DataProto.from_dict(
        non_tensors={"raw_prompt_ids": prompts, "seed": list(range(NUM_PROMPTS))}
    )
    try:
        out = generator.generate_sequences(batch)
    finally:
        generator.shutdown()
    out.meta_info["temperature"] = 1.0
    return out


def _trainer_pass(
    moe_dir: str, batch: DataProto, replay: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 fsdp engine's log-probs and the experts its routers used [B, S, L, k]."""
    engine = build_engine("fsdp", {"model": {"path": moe_dir}, "inference_only": True,
                                   "router_replay": replay})  # fmt: skip
    used: list[torch.Tensor] = []
    routers = [m for n, m in engine.model.named_modules() if n.endswith("mlp.gate")]
    for router in routers:  # registered after the replay's hooks: sees the experts used
        router.register_forward_hook(lambda mod, inp, out: used.append(out[2].detach()))
    try:
        log_probs = engine.infer_batch(batch, outputs=("log_probs",)).batch["log_probs"]
    finally:
        engine.close()
    shape = batch.batch["input_ids"].shape
    return log_probs, torch.stack(used, 1).reshape(*shape, len(routers), -1)


def test_replay_makes_the_trainer_route_as_the_bf16_rollout(moe_dir, rollout_batch, capsys):
    batch = rollout_batch
    recorded = batch.batch["routed_experts"]
    assert recorded.dtype == torch.int16 and recorded.shape[:2] == batch.batch["input_ids"].shape
    real = batch.batch["attention_mask"].bool()
    has_record = (recorded >= 0).all(-1).all(-1)  # [B, S]
    # every real token but each row's last response token was read by a rollout forward
    assert torch.equal(has_record.sum(-1), real.sum(-1) - 1)
    assert not (has_record & ~real).any()

    def tokens_routed_differently(used: torch.Tensor) -> int:
        same = (used.sort(-1).values == recorded.long().sort(-1).values).all(-1).all(-1)
        return int((has_record & ~same).sum())

    mask = batch.batch["response_mask"].bool()
    rollout_lp = batch.batch["rollout_log_probs"]
    plain_lp, plain_used = _trainer_pass(moe_dir, batch, replay=False)
    replay_lp, replay_used = _trainer_pass(moe_dir, batch, replay=True)
    plain_diff = (plain_lp - rollout_lp).abs()[mask]
    replay_diff = (replay_lp - rollout_lp).abs()[mask]
    differ_plain = tokens_routed_differently(plain_used)
    differ_replay = tokens_routed_differently(replay_used)
    with capsys.disabled():
        print(
            f"\nrouter replay, bf16 rollout vs fp32 trainer, {int(has_record.sum())} recorded "
            f"tokens x {recorded.shape[2]} MoE layers, {int(mask.sum())} response tokens:\n"
            f"  tokens routed differently: without replay {differ_plain}, with {differ_replay}\n"
            f"  mean |log-prob diff|: without replay {plain_diff.mean():.5f}, with "
            f"{replay_diff.mean():.5f}; max: {plain_diff.max():.4f} vs {replay_diff.max():.4f}"
        )
    assert differ_plain > 0  # the precisions disagree on some tokens' experts
    assert differ_replay == 0  # the replay routes every recorded token as the rollout did
    assert replay_diff.mean() < 0.75 * plain_diff.mean()
    assert replay_diff.max() < plain_diff.max()


def test_the_example_trains_with_replay(tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [str(RL), "train", str(EXAMPLE), f"trainer.output_dir={out}", "trainer.loggers=[jsonl]"],
        capture_output=True, text=True, cwd=tmp_path, timeout=900, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "moe/router_replay_changed_fraction" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:  # the bf16 rollout and the fp32 trainer disagree on few selections
        assert 0.0 <= row["moe/router_replay_changed_fraction"] < 0.2


def test_router_replay_on_a_dense_model_is_refused_in_one_line(tmp_path, capsys):
    from rl_algos.cli import main

    status = main(["train", str(EXAMPLE), f"trainer.output_dir={tmp_path / 'out'}",
                   "model.path=tiny-random:qwen2"])  # fmt: skip
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("rl train:")]
    assert status == 2, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith(
        "rl train: config error: actor.router_replay: invalid value True; expected false for the "
        "dense model 'tiny-random:qwen2'"
    ), err[-3000:]

"""`rl export`: a trainer checkpoint (DCP shards of 2 FSDP ranks) becomes a Hugging Face
model directory whose log-probs equal the training engine's on the same tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rl_algos.cli import main as rl_main
from rl_algos.trainer.loop import RLTrainer

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def _batch(vocab: int):
    from rl_core.testing.train_engine import make_rl_batch

    batch = make_rl_batch(num_seqs=6, prompt_len=10, response_len=8, seed=3)
    for key in ("input_ids", "responses"):
        batch.batch[key] = batch.batch[key] % vocab
    return batch


def _engine_log_probs(model_dir: str, checkpoint: str, batch) -> torch.Tensor:
    """The fsdp engine (one process here; the checkpoint came from 2 ranks) after loading."""
    import torch.distributed as dist

    from rl_core.engine import build_engine
    from rl_core.testing.train_engine import engine_config

    engine = build_engine("fsdp", engine_config(model_dir, {}))
    try:
        engine.load(checkpoint)
        return engine.infer_batch(batch, outputs=("log_probs",), temperature=1.0).batch["log_probs"]
    finally:
        engine.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def test_export_of_a_trained_checkpoint_matches_the_engine(ray_cluster, make_config, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from rl_core.testing.train_engine import reference_outputs

    config = make_config(
        "grpo", ["trainer.total_steps=1", "trainer.save_every=1", "actor.optim.lr=5e-2"]
    )
    trainer = RLTrainer(config)
    try:
        trainer.fit()
    finally:
        trainer.close()
    base_dir = trainer.model_path
    run_dir = config.trainer.output_dir
    step_dir = f"{run_dir}/checkpoints/step_1"

    out = tmp_path / "exported"
    assert rl_main(["export", run_dir, str(out)]) == 0  # the run dir: its latest checkpoint
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors"} <= files
    assert "tokenizer.json" in files or "tokenizer_config.json" in files
    assert json.loads((out / "rl_export.json").read_text())["step"] == 1

    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.encode("12+3") == AutoTokenizer.from_pretrained(base_dir).encode("12+3")
    gen = GenerationConfig.from_pretrained(out)
    assert gen.eos_token_id == GenerationConfig.from_pretrained(base_dir).eos_token_id

    model = AutoModelForCausalLM.from_pretrained(out)
    batch = _batch(model.config.vocab_size)
    engine_lp = _engine_log_probs(base_dir, f"{step_dir}/actor", batch)
    # independent float64 re-derivation from the exported directory with transformers
    exported = reference_outputs(str(out), batch, 1.0, value_head=False)["log_probs"]
    mask = batch.batch["attention_mask"][:, 10:].bool()
    torch.testing.assert_close(engine_lp.double()[mask], exported[mask], atol=2e-5, rtol=1e-4)
    # the export holds the trained weights, not the base model's
    base = reference_outputs(base_dir, batch, 1.0, value_head=False)["log_probs"]
    assert (base[mask] - exported[mask]).abs().max() > 1e-3

    # bfloat16 export of the same checkpoint, and a clear error for a non-empty OUT_DIR
    bf16 = tmp_path / "bf16"
    assert rl_main(["export", step_dir, str(bf16), "--dtype", "bfloat16"]) == 0
    assert AutoModelForCausalLM.from_pretrained(bf16).dtype == torch.bfloat16
    assert rl_main(["export", step_dir, str(out)]) == 2


def test_export_errors_name_the_problem(tmp_path, capsys):
    assert rl_main(["export", str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    (tmp_path / "engine_ckpt").mkdir()
    assert rl_main(["export", str(tmp_path / "engine_ckpt"), str(tmp_path / "out")]) == 2
    assert "pass --model HF_DIR" in capsys.readouterr().err


def test_lora_run_of_grpo_tiny_exports_adapter_and_merged_model(tmp_path):
    """examples/grpo_tiny.yaml with LoRA for 4 steps (local backend), a KL loss against the reference
    (the base model with adapters disabled), then both export formats.

    The rollout receives merged weights after every update: its sampled tokens' log-probs
    equal the actor's (PEFT model, recomputed) old log-probs, which differ from the base
    model's (the reference) once the adapters have learned."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rl_algos.config import load_config
    from rl_core.testing.train_engine import reference_outputs

    root = Path(__file__).resolve().parents[2]
    config = load_config(
        str(root / "examples" / "grpo_tiny.yaml"),
        [
            f"trainer.output_dir={tmp_path / 'run'}",
            "trainer.loggers=[jsonl]",
            "model.lora.rank=4",
            "model.lora.alpha=8",
            "actor.optim.lr=5e-2",
            "actor.loss.kl_loss_coef=0.01",
            "trainer.total_steps=4",
            "trainer.backend=local",  # one in-process worker (2 Ray ranks: the test above)
            "trainer.num_workers=1",
            "trainer.save_every=4",
            "actor.recompute_old_log_probs=true",  # the actor's log-probs of every sample
            "trainer.val_every=0",
            # a dense reward (share of digits) so a random model's samples differ in score
            f"reward.function_path={Path(__file__).with_name('digit_reward.py')}",
        ],
    )
    trainer = RLTrainer(config)
    updates = []
    update_actor = trainer.groups.actor.update_actor

    def recording_update_actor(batch):
        updates.append(batch)
        return update_actor(batch)

    trainer.groups.actor.update_actor = recording_update_actor
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    steps = [h for h in history if h["step"] > 0]  # step 0: validation before training
    assert len(steps) == 4
    kl = [h["actor/kl_loss"] for h in steps]
    grad = [h["actor/grad_norm"] for h in steps]
    # adapters start at B = 0: the policy is the reference (adapters disabled) exactly
    # until the first step with a gradient (the first steps of a random model may all score
    # 0); the KL measured in the next step is positive
    first = next(i for i, g in enumerate(grad) if g > 0)
    assert first < len(steps) - 1, f"no update before the last step: {grad}"
    assert all(abs(k) < 1e-7 for k in kl[: first + 1]) and kl[first + 1] > 1e-7, kl
    for step, batch in enumerate(updates):
        t = batch.batch
        mask = t["response_mask"].bool()
        rollout, old, ref = (
            t[k][mask] for k in ("rollout_log_probs", "old_log_probs", "ref_log_prob")
        )
        # the rollout sampled with the merged weights of exactly this actor
        torch.testing.assert_close(rollout, old, atol=2e-4, rtol=0)
        gap = float((old - ref).abs().max())
        if step <= first:  # adapters still at B = 0: merged == base
            assert gap < 1e-5, (step, gap)
        else:  # trained adapters: the policy left the base model
            assert gap > 1e-3, (step, gap)
    step_dir = tmp_path / "run" / "checkpoints" / "step_4"
    adapter_dir, merged_dir = tmp_path / "adapter", tmp_path / "merged"
    assert rl_main(["export", str(step_dir), str(adapter_dir)]) == 0
    assert rl_main(["export", str(step_dir), str(merged_dir), "--merge-lora"]) == 0
    assert (adapter_dir / "adapter_model.safetensors").is_file()
    assert not (adapter_dir / "model.safetensors").exists()

    base_dir = trainer.model_path
    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base_dir), adapter_dir
    )
    merged_state = peft_model.merge_and_unload().state_dict()
    exported = AutoModelForCausalLM.from_pretrained(merged_dir).state_dict()
    for name, tensor in exported.items():
        torch.testing.assert_close(merged_state[name], tensor, atol=1e-5, rtol=1e-5)
    batch = _batch(len(exported["model.embed_tokens.weight"]))
    mask = batch.batch["attention_mask"][:, 10:].bool()
    merged = reference_outputs(str(merged_dir), batch, 1.0)["log_probs"]
    base = reference_outputs(base_dir, batch, 1.0)["log_probs"]
    assert (merged[mask] - base[mask]).abs().max() > 1e-4  # the adapters learned something

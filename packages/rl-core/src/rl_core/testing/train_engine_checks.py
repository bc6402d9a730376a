"""The checks of `rl_core.testing.train_engine`'s conformance suites: tiny models, the
reference computations and one function per check, run on every spawned rank. A module of
its own so that the suite classes and the device/distributed checks all import it, and it
imports none of them."""

from __future__ import annotations

import copy
import os
import re
from typing import Any

import pytest
import torch

from rl_core.checkpoint import CheckpointCorruptError, staging_path, verify_manifest
from rl_core.engine import EngineConfig, LossContext, TrainEngine, build_engine, layer_of
from rl_core.protocol import DataProto

VOCAB = 512


def tiny_hf_config(model_type: str, **overrides: Any) -> dict[str, Any]:
    """A tiny config dict (vocab 512, hidden 64, 2 layers); Qwen2 ties its embeddings."""
    config = {
        "model_type": model_type,
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "tie_word_embeddings": model_type == "qwen2",
    }
    config.update(overrides)
    return config


def save_tiny_model(
    directory: str, model_type: str, value_head: bool = False, seed: int = 0, **overrides: Any
) -> str:
    """Save a random tiny causal LM (or a 1-label token-classification model) to ``directory``;
    `overrides`: config fields over `tiny_hf_config`'s."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    fields = tiny_hf_config(model_type, **overrides)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(seed)
    if value_head:
        config.num_labels = 1
        config.classifier_dropout = 0.0
        model = AutoModelForTokenClassification.from_config(config)
    else:
        model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(directory)
    return directory


def make_rl_batch(
    num_seqs: int = 8, prompt_len: int = 10, response_len: int = 8, seed: int = 0
) -> DataProto:
    """A fixed RL batch in the verl layout: left-padded prompts, right-padded responses,
    some tool-output tokens masked out of ``response_mask``, advantages and returns."""
    g = torch.Generator().manual_seed(seed)
    seq_len = prompt_len + response_len
    input_ids = torch.randint(1, VOCAB, (num_seqs, seq_len), generator=g)
    attention_mask = torch.zeros(num_seqs, seq_len, dtype=torch.long)
    response_mask = torch.zeros(num_seqs, response_len, dtype=torch.long)
    for i in range(num_seqs):
        p = int(torch.randint(2, prompt_len + 1, (1,), generator=g))
        r = int(torch.randint(1, response_len + 1, (1,), generator=g))
        attention_mask[i, prompt_len - p : prompt_len + r] = 1
        response_mask[i, :r] = 1
        if r >= 4 and i % 3 == 0:  # a tool observation inside the response
            response_mask[i, 1:3] = 0
    input_ids = input_ids * attention_mask  # pad id 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "responses": input_ids[:, prompt_len:].clone(),
        "response_mask": response_mask,
        "advantages": torch.randn(num_seqs, response_len, generator=g) * response_mask,
        "returns": torch.randn(num_seqs, response_len, generator=g) * response_mask,
    }
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})


def pg_loss(outputs: dict[str, torch.Tensor], mb: DataProto, ctx: LossContext):
    """-sum(log_prob * advantage) over response tokens / global token count (sum-style).

    Uses the micro-batch as given: the engine must hand it over on its own device."""
    mask = mb.batch["response_mask"].float()
    adv = mb.batch["advantages"]
    loss = -(outputs["log_probs"] * adv * mask).sum() / ctx.global_num_tokens
    return loss, {"pg_tokens": float(mask.sum()) / ctx.global_num_tokens}


def value_loss(outputs: dict[str, torch.Tensor], mb: DataProto, ctx: LossContext):
    """0.5 * squared error to the returns / global token count (sum-style)."""
    mask = mb.batch["response_mask"].float()
    ret = mb.batch["returns"]
    loss = 0.5 * (((outputs["values"] - ret) ** 2) * mask).sum() / ctx.global_num_tokens
    return loss, {}


def _nan_loss(outputs, mb, ctx):
    loss, metrics = pg_loss(outputs, mb, ctx)
    return loss * float("nan"), metrics


def reference_outputs(
    model_dir: str,
    batch: DataProto,
    temperature: float = 1.0,
    value_head: bool = False,
    state_dict: dict[str, torch.Tensor] | None = None,
    dtype: torch.dtype = torch.float64,
) -> dict[str, torch.Tensor]:
    """Float64 single-process Hugging Face forward: [B, R] log_probs/entropy or values
    (float64 results; ``dtype`` runs the model in another precision, e.g. the bfloat16
    gap an engine's bf16 run may show)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    auto = AutoModelForTokenClassification if value_head else AutoModelForCausalLM
    if state_dict is None:
        model = auto.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager")
    else:
        config = AutoConfig.from_pretrained(model_dir)
        model = auto.from_config(config, dtype=dtype, attn_implementation="eager")
        result = model.load_state_dict(
            {k: v.to(dtype) for k, v in state_dict.items()}, strict=False
        )
        assert not result.unexpected_keys, f"exported unknown names {result.unexpected_keys}"
        tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
        assert set(result.missing_keys) <= tied, f"export lacks {result.missing_keys}"
        model.tie_weights()
    model.eval()
    t = batch.batch
    num_seqs, seq_len = t["input_ids"].shape
    resp_len = t["responses"].shape[1]
    prompt_len = seq_len - resp_len
    keys = ("values",) if value_head else ("log_probs", "entropy")
    result = {k: torch.zeros(num_seqs, resp_len, dtype=torch.float64) for k in keys}
    for i in range(num_seqs):  # each sequence alone, without padding: no mask logic at all
        real = t["attention_mask"][i].bool()
        ids = t["input_ids"][i][real].unsqueeze(0)
        prompt_real = int(real[:prompt_len].sum())
        resp_real = int(real[prompt_len:].sum())
        with torch.no_grad():
            out = model(input_ids=ids).logits[0].double()
        rows = slice(prompt_real - 1, prompt_real - 1 + resp_real)
        if value_head:
            result["values"][i, :resp_real] = out[rows, 0]
            continue
        logp = torch.log_softmax(out[rows] / temperature, dim=-1)
        labels = t["responses"][i, :resp_real]
        result["log_probs"][i, :resp_real] = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        result["entropy"][i, :resp_real] = -(logp.exp() * logp).sum(-1)
    return result


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def engine_config(model_dir: str, options: dict[str, Any], **overrides: Any) -> EngineConfig:
    """The suite's base config (AdamW lr 1e-3, no clipping, 120 s timeouts) + options."""
    base = {
        "model": {"path": model_dir},
        "optim": {"lr": 1e-3, "weight_decay": 0.01, "grad_clip": None},
        "timeout_s": 120.0,
    }
    return EngineConfig.from_dict(_merge(_merge(base, options), overrides))


def _weights(engine: TrainEngine) -> dict[str, torch.Tensor]:
    return {n: t.float().cpu().clone() for b in engine.export_weights() for n, t in b}


def _shard(batch: DataProto, engine: TrainEngine) -> DataProto:
    return batch.chunk(engine.dp_size)[engine.dp_rank]


def _close(a: float, b: float, tol: float = 1e-5) -> bool:
    return abs(a - b) <= tol * max(1.0, abs(b))


# ---- checks: run on every rank ---------------------------------------------------------


def check_training(spec: dict[str, Any]) -> list[float]:
    value = spec["value_head"]
    engine = build_engine(spec["engine"], engine_config(spec["model_dir"], spec["options"]))
    batch = make_rl_batch()
    ref = reference_outputs(spec["model_dir"], batch, value_head=value)
    mask = batch.batch["response_mask"].double()
    n = float(mask.sum())
    if value:
        expected = float(
            (0.5 * (ref["values"] - batch.batch["returns"].double()) ** 2 * mask).sum() / n
        )
    else:
        expected = float(-(ref["log_probs"] * batch.batch["advantages"].double() * mask).sum() / n)
    loss_fn = value_loss if value else pg_loss
    losses = []
    for step in range(4):
        m = engine.train_batch(_shard(batch, engine), loss_fn)
        losses.append(m["loss"])
        assert m["num_tokens"] == n and m["num_seqs"] == len(batch), m
        assert m["lr"] == pytest.approx(1e-3) and m["skipped"] == 0.0, m
        assert m["grad_norm"] > 0 and torch.isfinite(torch.tensor(m["grad_norm"])), m
        if step == 0:
            assert _close(m["loss"], expected, 1e-4), (m["loss"], expected)
            if not value:
                assert m["pg_tokens"] == pytest.approx(1.0), m
    assert engine.global_step == 4
    assert losses[-1] < losses[0], losses
    return losses


def check_infer_matches_hf(spec: dict[str, Any]) -> None:
    value = spec["value_head"]
    engine = build_engine(spec["engine"], engine_config(spec["model_dir"], spec["options"]))
    local = _shard(make_rl_batch(), engine)
    kinds = ("values",) if value else ("log_probs", "entropy")
    for temperature in (1.0, 0.7):
        out = engine.infer_batch(local, outputs=kinds, temperature=temperature)
        ref = reference_outputs(spec["model_dir"], local, temperature, value_head=value)
        assert len(out) == len(local)
        for key in kinds:
            assert out.batch[key].shape == local.batch["responses"].shape, key
            torch.testing.assert_close(out.batch[key].double(), ref[key], atol=2e-5, rtol=1e-4)
    if not value:  # temperature from meta_info
        local.meta_info["temperature"] = 0.7
        out = engine.infer_batch(local, outputs=("log_probs",))
        torch.testing.assert_close(
            out.batch["log_probs"].double(), ref["log_probs"], atol=2e-5, rtol=1e-4
        )


def check_micro_batching(spec: dict[str, Any]) -> None:
    loss_fn = value_loss if spec["value_head"] else pg_loss
    batch = make_rl_batch(num_seqs=12)
    lengths = batch.batch["attention_mask"].sum(-1)
    results = []
    # a large Adam eps keeps the update ~linear in the gradient: with the default eps,
    # g / (|g| + eps) turns float rounding of a ~1e-8 gradient into a visible change
    optim = {"eps": 1e-3}
    for micro in (
        {},
        {"micro_batch_size": 2},
        {"max_tokens_per_micro_batch": int(lengths.max()) + 4},
    ):
        cfg = engine_config(
            spec["model_dir"],
            spec["options"],
            micro_batch=micro,
            infer_micro_batch=micro,
            optim=optim,
        )
        engine = build_engine(spec["engine"], cfg)
        local = _shard(batch, engine)
        m = engine.train_batch(local, loss_fn)
        kinds = ("values",) if spec["value_head"] else ("log_probs",)
        infer = engine.infer_batch(local, outputs=kinds).batch[kinds[0]]
        results.append((m, _weights(engine), infer))
        engine.close()
        del engine
    base_m, base_w, base_infer = results[0]
    assert base_m["num_micro_batches"] == 1
    for m, w, infer in results[1:]:
        assert m["num_micro_batches"] > 1, m
        assert _close(m["loss"], base_m["loss"]) and _close(m["grad_norm"], base_m["grad_norm"]), (
            m,
            base_m,
        )
        for name in base_w:
            torch.testing.assert_close(w[name], base_w[name], atol=2e-6, rtol=0)
        torch.testing.assert_close(infer, base_infer, atol=1e-4, rtol=1e-4)


def check_save_load(spec: dict[str, Any]) -> None:
    loss_fn = value_loss if spec["value_head"] else pg_loss
    optim = {"lr_schedule": "cosine", "warmup_steps": 2, "total_steps": 6, "min_lr_ratio": 0.1}
    cfg = engine_config(spec["model_dir"], spec["options"], optim=optim)
    batches = [make_rl_batch(seed=s) for s in range(4)]
    path = os.path.join(spec["tmp"], "ckpt")
    first = build_engine(spec["engine"], cfg)
    for b in batches[:2]:
        first.train_batch(_shard(b, first), loss_fn)
    first.save(path)
    # rl_core.checkpoint's contract: published atomically, with a manifest that verifies
    assert not os.path.exists(staging_path(path)) and os.path.isdir(path)
    manifest = verify_manifest(path)
    assert manifest["files"], manifest
    first.save(path)  # a re-save of the same path replaces it and still verifies
    assert verify_manifest(path)["files"].keys() == manifest["files"].keys()
    expected = [first.train_batch(_shard(b, first), loss_fn) for b in batches[2:]]
    expected_w = _weights(first)
    first.close()
    second = build_engine(spec["engine"], cfg)
    second.load(path)
    assert second.global_step == 2
    got = [second.train_batch(_shard(b, second), loss_fn) for b in batches[2:]]
    got_w = _weights(second)
    for m1, m2 in zip(expected, got):
        for key in m1:
            assert m1[key] == m2[key], (key, m1[key], m2[key])
    for name in expected_w:
        assert torch.equal(expected_w[name], got_w[name]), name
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    second.close()
    # a corrupted file (the largest: model/optimizer data) is refused with its name; rank 0
    # corrupts it before building its engine, so no rank loads before it is corrupted
    victim = max(manifest["files"], key=lambda name: manifest["files"][name]["size"])
    if rank == 0:
        with open(os.path.join(path, victim), "r+b") as f:
            f.seek(manifest["files"][victim]["size"] // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
    third = build_engine(spec["engine"], cfg)
    try:
        with pytest.raises(CheckpointCorruptError, match=re.escape(victim)):
            third.load(path)
    finally:
        third.close()


def check_snapshot(spec: dict[str, Any]) -> None:
    """In-memory snapshots (engines with ``supports_snapshots``; others skip): the host copy
    of the state after 2 steps stays put while training goes on, restores into the same
    engine and into a fresh one, and both then train the next 2 steps bit-exactly like
    the original; a snapshot that does not fit is refused naming the tensor."""
    from rl_core.engine import ENGINES, HostSnapshot

    if not getattr(ENGINES.get(spec["engine"]), "supports_snapshots", False):
        return
    optim = {"lr_schedule": "cosine", "warmup_steps": 2, "total_steps": 6, "min_lr_ratio": 0.1}
    cfg = engine_config(spec["model_dir"], spec["options"], optim=optim)
    batches = [make_rl_batch(seed=s) for s in range(4)]
    first = build_engine(spec["engine"], cfg)
    for b in batches[:2]:
        first.train_batch(_shard(b, first), pg_loss)
    host = HostSnapshot()
    host.capture(first.snapshot_view())
    host.wait_copied()
    before = {name: t.clone() for name, t in host.tensors().items()}
    assert before and host.nbytes >= sum(t.numel() * t.element_size() for t in before.values())

    def train_rest(engine: TrainEngine) -> tuple[list[dict[str, float]], dict[str, Any]]:
        torch.manual_seed(1234)  # a loss with dropout would draw from the restored RNG
        metrics = [engine.train_batch(_shard(b, engine), pg_loss) for b in batches[2:]]
        return metrics, _weights(engine)

    expected, expected_w = train_rest(first)
    for name, tensor in host.tensors().items():  # a copy, not the live tensors
        assert torch.equal(tensor, before[name]), f"the host copy of {name} changed"
    first.restore_snapshot(copy.deepcopy(host.state), host.tensors())
    assert first.global_step == 2
    again = [train_rest(first)]
    first.close()
    second = build_engine(spec["engine"], cfg)
    second.restore_snapshot(copy.deepcopy(host.state), before)
    assert second.global_step == 2
    for metrics, weights in [*again, train_rest(second)]:
        for m1, m2 in zip(expected, metrics):
            for key in m1:
                assert m1[key] == m2[key], (key, m1[key], m2[key])
        for name in expected_w:
            assert torch.equal(expected_w[name], weights[name]), name
    name = next(iter(before))
    bad = {**before, name: before[name].reshape(-1)[:1]}
    with pytest.raises(ValueError, match=re.escape(name)):
        second.restore_snapshot(copy.deepcopy(host.state), bad)
    second.close()


def check_export(spec: dict[str, Any]) -> None:
    engine = build_engine(spec["engine"], engine_config(spec["model_dir"], spec["options"]))
    batch = make_rl_batch()
    engine.train_batch(_shard(batch, engine), pg_loss)  # export the updated weights
    budget = 64 * 1024
    seen: dict[str, torch.Tensor] = {}
    home: dict[str, int] = {}  # layer -> the bucket that holds it
    for index, bucket in enumerate(engine.export_weights(bucket_bytes=budget)):
        nbytes = sum(t.numel() * t.element_size() for _, t in bucket)
        layers = {layer_of(n) for n, _ in bucket}
        # bounded, or one indivisible layer alone (whole layers: fused params never split)
        assert nbytes <= budget or len(layers) == 1, (nbytes, [n for n, _ in bucket])
        for name, tensor in bucket:
            assert name not in seen, f"{name} exported twice"
            assert home.setdefault(layer_of(name), index) == index, f"{name}: layer split"
            seen[name] = tensor.detach().cpu().clone()
    bf16 = [t for b in engine.export_weights(dtype=torch.bfloat16) for _, t in b]
    assert bf16 and all(t.dtype == torch.bfloat16 for t in bf16)
    ref = reference_outputs(spec["model_dir"], batch, state_dict=seen)
    got = engine.infer_batch(batch[: max(2, engine.dp_size)], outputs=("log_probs",))
    want = ref["log_probs"][: max(2, engine.dp_size)]
    torch.testing.assert_close(got.batch["log_probs"].double(), want, atol=2e-5, rtol=1e-4)


def check_offload(spec: dict[str, Any]) -> None:
    cfg = engine_config(spec["model_dir"], spec["options"])
    batch = make_rl_batch()
    engine = build_engine(spec["engine"], cfg)
    local = _shard(batch, engine)
    before = engine.infer_batch(local, outputs=("log_probs", "entropy"))
    engine.offload()
    engine.onload()
    after = engine.infer_batch(local, outputs=("log_probs", "entropy"))
    for key in ("log_probs", "entropy"):
        assert torch.equal(before.batch[key], after.batch[key]), key
    m1 = engine.train_batch(local, pg_loss)
    engine.offload()
    engine.onload()
    m2 = engine.train_batch(local, pg_loss)
    w = _weights(engine)
    engine.close()
    plain = build_engine(spec["engine"], cfg)
    r1 = plain.train_batch(local, pg_loss)
    r2 = plain.train_batch(local, pg_loss)
    assert (m1["loss"], m2["loss"]) == (r1["loss"], r2["loss"])
    for name, tensor in _weights(plain).items():
        assert torch.equal(tensor, w[name]), name


def check_bad_input(spec: dict[str, Any]) -> None:
    engine = build_engine(spec["engine"], engine_config(spec["model_dir"], spec["options"]))
    local = _shard(make_rl_batch(), engine)
    missing = local.select(
        batch_keys=["input_ids", "attention_mask", "position_ids", "responses", "advantages"]
    )
    with pytest.raises(ValueError, match="response_mask"):
        engine.train_batch(missing, pg_loss)
    t = dict(local.batch.items())
    short = DataProto.from_dict({**t, "attention_mask": t["attention_mask"][:, 1:]})
    with pytest.raises(ValueError, match="attention_mask"):
        engine.train_batch(short, pg_loss)
    mask = DataProto.from_dict({**t, "response_mask": t["response_mask"][:, 1:]})
    with pytest.raises(ValueError, match="response_mask"):
        engine.train_batch(mask, pg_loss)
    with pytest.raises(ValueError, match="outputs"):
        engine.infer_batch(local, outputs=("values",))
    with pytest.raises(ValueError, match="temperature"):
        engine.infer_batch(local, temperature=0.0)


def check_nan_loss(spec: dict[str, Any]) -> None:
    local = None
    for on_nan in ("raise", "skip"):
        cfg = engine_config(spec["model_dir"], spec["options"], on_nan=on_nan)
        engine = build_engine(spec["engine"], cfg)
        local = _shard(make_rl_batch(), engine)
        before = _weights(engine)
        if on_nan == "raise":
            with pytest.raises(FloatingPointError, match="non-finite"):
                engine.train_batch(local, _nan_loss)
        else:
            assert engine.train_batch(local, _nan_loss)["skipped"] == 1.0
        assert engine.global_step == 0
        for name, tensor in _weights(engine).items():
            assert torch.equal(tensor, before[name]), f"{name} changed after a NaN loss"
        m = engine.train_batch(local, pg_loss)  # the engine is still usable
        assert m["skipped"] == 0.0 and engine.global_step == 1
        engine.save(os.path.join(spec["tmp"], f"after-nan-{on_nan}"))
        engine.close()


class _DeviceCheckingLoss:
    """`pg_loss` (or `value_loss`) that first fails unless every tensor it is given lives
    on ``device``, and records the output kinds it saw."""

    def __init__(self, device: torch.device, value: bool) -> None:
        self.device, self.value, self.seen = torch.device(device), value, set()

    def __call__(self, outputs, mb, ctx):
        given = {f"outputs[{k!r}]": t for k, t in outputs.items()}
        given.update({f"micro_batch[{k!r}]": t for k, t in mb.batch.items()})
        off = {k: str(t.device) for k, t in given.items() if t.device != self.device}
        if off:
            raise AssertionError(f"loss got tensors off the engine's device {self.device}: {off}")
        self.seen.update(outputs)
        return (value_loss if self.value else pg_loss)(outputs, mb, ctx)


def check_device_contract(spec: dict[str, Any]) -> None:
    value = spec["value_head"]
    engine = build_engine(spec["engine"], engine_config(spec["model_dir"], spec["options"]))
    assert isinstance(engine.device, torch.device), engine.device
    local = _shard(make_rl_batch(), engine)
    loss = _DeviceCheckingLoss(engine.device, value)
    engine.train_batch(local, loss)
    kinds = ("values",) if value else ("log_probs", "entropy")
    out = engine.infer_batch(local, outputs=kinds)
    for key in kinds:
        assert out.batch[key].device.type == "cpu", (key, out.batch[key].device)
    if value:
        return
    # entropy requested in training reaches the loss and matches the reference
    captured: dict[str, torch.Tensor] = {}

    def entropy_loss(outputs, mb, ctx):
        captured.setdefault("entropy", outputs["entropy"].detach().cpu())
        captured.setdefault("mask", mb.batch["response_mask"].cpu())
        return loss(outputs, mb, ctx)

    cfg = engine_config(spec["model_dir"], spec["options"], optim={"lr": 0.0})
    fresh = build_engine(spec["engine"], cfg)
    fresh.train_batch(local, entropy_loss, outputs=("log_probs", "entropy"))
    if not captured:  # ranks that never run the loss (first pipeline stages)
        assert not fresh.is_collect_rank, "the collect rank never called the loss"
        return
    assert {"log_probs", "entropy"} <= loss.seen, loss.seen
    ref = reference_outputs(spec["model_dir"], local)["entropy"]
    if captured["entropy"].shape == ref.shape:  # one micro-batch: rows in batch order
        mask = captured["mask"].bool()
        torch.testing.assert_close(
            captured["entropy"].double()[mask], ref[mask], atol=2e-5, rtol=1e-4
        )


def _host_bytes(model_dir: str) -> int:
    """Bytes of the model's parameters as saved (float32): the least the device holds."""
    from safetensors import safe_open

    total = 0
    for name in os.listdir(model_dir):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(model_dir, name), "pt") as f:
                for key in f.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                    total += _numel(f.get_slice(key).get_shape()) * 4
    return total


def _numel(shape: list[int]) -> int:
    n = 1
    for dim in shape:
        n *= int(dim)
    return n


def check_standin_device(spec: dict[str, Any]) -> dict[str, int]:
    """The device contract on `rl_core.testing.standin`'s host-backed accelerator, where
    host and device differ (on a CPU machine they do not): the engine takes the platform's
    device; the loss sees the micro-batch there; `infer_batch` returns host tensors equal to
    the float64 reference; offload frees the device memory of parameters and optimizer
    state (by the platform's memory query, >= 90%) and onload brings it back."""
    from rl_core.platform import get_platform
    from rl_core.testing.standin import DEVICE_TYPE, install

    install()
    os.environ["RL_PLATFORM"] = DEVICE_TYPE
    platform = get_platform()
    engine = build_engine(spec["engine"], engine_config(spec["model_dir"], spec["options"]))
    assert engine.device.type == DEVICE_TYPE, (
        f"engine.device is {engine.device}: expected the platform's device {DEVICE_TYPE}"
    )
    local = _shard(make_rl_batch(), engine)
    out = engine.infer_batch(local, outputs=("log_probs", "entropy"))
    ref = reference_outputs(spec["model_dir"], local)
    for key in ("log_probs", "entropy"):
        got = out.batch[key]
        assert got.device.type == "cpu" and type(got) is torch.Tensor, (
            f"infer_batch returned {key} on {got.device} ({type(got).__name__}): expected "
            "plain CPU tensors"
        )
        torch.testing.assert_close(got.double(), ref[key], atol=2e-5, rtol=1e-4, msg=key)
    loss = _DeviceCheckingLoss(engine.device, value=False)
    engine.train_batch(local, loss)
    trained = engine.infer_batch(local, outputs=("log_probs",)).batch["log_probs"]
    on_device = platform.memory_allocated()
    least = _host_bytes(spec["model_dir"]) // engine.dp_size
    assert on_device >= least, (
        f"{on_device} bytes on the device after a step: expected at least the parameters' "
        f"{least} bytes (is the model on engine.device?)"
    )
    engine.offload()
    offloaded = platform.memory_allocated()
    freed = on_device - offloaded
    assert freed >= 0.9 * on_device, (
        f"offload() freed {freed} of {on_device} device bytes ({offloaded} left): expected "
        ">= 90% (parameters, gradients and optimizer state off the device)"
    )
    engine.onload()
    onloaded = platform.memory_allocated()
    assert onloaded >= least, (
        f"onload() brought {onloaded} bytes back to the device: expected at least the "
        f"parameters' {least} bytes"
    )
    again = engine.infer_batch(local, outputs=("log_probs",)).batch["log_probs"]
    assert torch.equal(again, trained), "offload/onload changed the log-probs"
    engine.train_batch(local, loss)  # optimizer state came back to the device too
    engine.close()
    return {"on_device": on_device, "offloaded": offloaded, "onloaded": onloaded}


def check_inference_only(spec: dict[str, Any]) -> None:
    cfg = engine_config(spec["model_dir"], spec["options"], inference_only=True)
    engine = build_engine(spec["engine"], cfg)
    local = _shard(make_rl_batch(), engine)
    kinds = ("values",) if spec["value_head"] else ("log_probs",)
    out = engine.infer_batch(local, outputs=kinds)
    ref = reference_outputs(spec["model_dir"], local, value_head=spec["value_head"])
    torch.testing.assert_close(out.batch[kinds[0]].double(), ref[kinds[0]], atol=2e-5, rtol=1e-4)
    optimizer = getattr(engine, "optimizer", None)
    assert optimizer is None or not getattr(optimizer, "state", None), "optimizer state exists"
    with pytest.raises(RuntimeError, match="inference_only"):
        engine.train_batch(local, value_loss if spec["value_head"] else pg_loss)


CHECKS = {
    "training": check_training,
    "infer_matches_hf": check_infer_matches_hf,
    "micro_batching": check_micro_batching,
    "save_load": check_save_load,
    "snapshot": check_snapshot,
    "export": check_export,
    "offload": check_offload,
    "bad_input": check_bad_input,
    "nan_loss": check_nan_loss,
    "device_contract": check_device_contract,
    "inference_only": check_inference_only,
}
VALUE_CHECKS = (
    "training",
    "infer_matches_hf",
    "micro_batching",
    "save_load",
    "device_contract",
    "inference_only",
)
CASES = [f"{name}-lm" for name in CHECKS] + [f"{name}-value" for name in VALUE_CHECKS]
DISTRIBUTED_CASES = ["gradient_sync", "reshard_2_to_1"]


def run_check(name: str, spec: dict[str, Any]) -> Any:
    """Rank side: import ``spec["engine_module"]`` (if any), then run check ``name``."""
    if spec.get("engine_module"):
        __import__(spec["engine_module"])
    return CHECKS[name](spec)


def run_standin_check(spec: dict[str, Any]) -> dict[str, int]:
    """Rank side of `TrainEngineDeviceConformance`: import ``spec["engine_module"]`` (if
    any), then `check_standin_device`."""
    if spec.get("engine_module"):
        __import__(spec["engine_module"])
    return check_standin_device(spec)


def engine_class(name: str, engine_module: str = "") -> Any:
    """The class (factory) registered as engine ``name`` (importing ``engine_module`` first)."""
    from rl_core.engine import ENGINES

    if engine_module:
        __import__(engine_module)
    return ENGINES.get(name)

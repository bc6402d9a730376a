"""The FSDP2 engine runs Qwen2-VL / Qwen2.5-VL forward and backward with images.

References: the Hugging Face model on each row alone, unpadded, with no position ids (it
derives its multimodal rotary positions itself); gradients checked through the weights an
optimizer step changes.
"""

from __future__ import annotations

import pytest
import torch
from vlm_cases import vlm_rl_batch

from rl_core.engine import EngineConfig, build_engine
from rl_core.testing.train_engine import pg_loss

ARCHS = ("qwen2_5_vl", "qwen2_vl")


def _engine(model_dir: str, packed: bool = False, **model):
    return build_engine(
        "fsdp",
        EngineConfig.from_dict(
            {
                "model": {"path": model_dir, **model},
                "engine_kwargs": {"use_remove_padding": packed},
                "optim": {"lr": 1e-2, "weight_decay": 0.1, "grad_clip": None},
                "micro_batch": {"max_tokens_per_micro_batch": 160},  # reorders rows
                "timeout_s": 120.0,
            }
        ),
    )


def _reference_log_probs(model_dir: str, batch, dtype=torch.float64) -> torch.Tensor:
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_dir).to(dtype).eval()
    t, rows = batch.batch, []
    resp_len = t["responses"].shape[1]
    for i in range(len(batch)):
        keep = t["attention_mask"][i].bool()
        ids = t["input_ids"][i][keep][None]
        mm = batch.non_tensor_batch["multi_modal_inputs"][i]
        with torch.no_grad():
            logits = (
                model(
                    input_ids=ids,
                    pixel_values=mm["pixel_values"].to(dtype),
                    image_grid_thw=mm["image_grid_thw"],
                    mm_token_type_ids=(ids == model.config.image_token_id).int(),
                )
                .logits[0]
                .double()
            )
        n_resp = int(t["response_mask"][i].sum())
        prompt_real = ids.shape[1] - n_resp
        lp = logits[prompt_real - 1 : -1].log_softmax(-1)
        got = lp.gather(-1, ids[0, prompt_real:, None])[:, 0]
        rows.append(torch.cat([got, torch.zeros(resp_len - n_resp, dtype=got.dtype)]))
    return torch.stack(rows)


@pytest.mark.parametrize("arch", ARCHS)
def test_log_probs_match_the_hf_model_row_by_row(vlm_dirs, arch):
    batch = vlm_rl_batch(vlm_dirs[arch], num_seqs=5, response_len=4, seed=1)
    engine = _engine(vlm_dirs[arch])
    out = engine.infer_batch(batch, outputs=("log_probs",))
    ref = _reference_log_probs(vlm_dirs[arch], batch)
    assert out.batch["log_probs"].device.type == "cpu"
    torch.testing.assert_close(out.batch["log_probs"].double(), ref, atol=2e-5, rtol=0)
    # the images matter: other pixels give other log-probs
    swapped = batch[[1, 0, 2, 3, 4]]
    swapped.batch = batch.batch.clone()
    other = engine.infer_batch(swapped, outputs=("log_probs",)).batch["log_probs"]
    assert (other[:2] - out.batch["log_probs"][:2]).abs().max() > 1e-4


def _changed(before: dict, after: dict, prefix: str) -> list[str]:
    names = [n for n in before if n.startswith(prefix)]
    assert names, prefix
    return [n for n in names if not torch.equal(before[n], after[n])]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("frozen", [False, True])
def test_vision_tower_trains_unless_frozen(vlm_dirs, arch, frozen):
    batch = vlm_rl_batch(vlm_dirs[arch], num_seqs=4, response_len=4, seed=2)
    engine = _engine(vlm_dirs[arch], freeze_vision_tower=frozen)
    weights = lambda: {n: t.clone() for b in engine.export_weights() for n, t in b}  # noqa: E731
    before = weights()
    metrics = engine.train_batch(batch, pg_loss)
    after = weights()
    assert metrics["grad_norm"] > 0 and metrics["skipped"] == 0
    vision = _changed(before, after, "model.visual.")
    text = _changed(before, after, "model.language_model.")
    assert text, "the language model must train"
    if frozen:
        assert vision == []
        assert not any(
            p.requires_grad for n, p in engine.model.named_parameters() if ".visual." in n
        )
    else:  # every vision parameter got a gradient (patch embedding included)
        assert set(vision) == {n for n in before if n.startswith("model.visual.")}


def test_text_only_model_rejects_freeze_vision_tower(tmp_path):
    from rl_core.testing.rollout_engine import save_tiny_causal_lm

    path = save_tiny_causal_lm(tmp_path / "lm")
    with pytest.raises(ValueError, match="freeze_vision_tower"):
        _engine(path, freeze_vision_tower=True)


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_layout_with_images_matches_padded_and_the_hf_model(vlm_dirs, arch):
    """use_remove_padding with images: the multimodal rotary positions are packed with the
    tokens (text positions as row 0, [4, 1, T]); log-probs and entropy equal the padded
    layout's and the float64 reference, row by row."""
    batch = vlm_rl_batch(vlm_dirs[arch], num_seqs=5, response_len=4, seed=3)
    packed = _engine(vlm_dirs[arch], packed=True)
    padded = _engine(vlm_dirs[arch], packed=False)
    assert packed.packed and not padded.packed
    got = packed.infer_batch(batch, outputs=("log_probs", "entropy")).batch
    want = padded.infer_batch(batch, outputs=("log_probs", "entropy")).batch
    torch.testing.assert_close(got["log_probs"], want["log_probs"], atol=2e-5, rtol=0)
    torch.testing.assert_close(got["entropy"], want["entropy"], atol=2e-5, rtol=0)
    ref = _reference_log_probs(vlm_dirs[arch], batch)
    torch.testing.assert_close(got["log_probs"].double(), ref, atol=2e-5, rtol=0)
    assert (got["entropy"][batch.batch["response_mask"].bool()] > 0).all()


def test_packed_layout_falls_back_to_padded_for_unknown_multimodal_positions(
    vlm_dirs, monkeypatch, caplog
):
    """A model whose multimodal positions are not known to pack runs padded, saying why."""
    from rl_engines.fsdp import forward

    batch = vlm_rl_batch(vlm_dirs["qwen2_vl"], num_seqs=3, response_len=3, seed=4)
    engine = _engine(vlm_dirs["qwen2_vl"], packed=True)
    want = engine.infer_batch(batch).batch["log_probs"]
    monkeypatch.setattr(forward, "PACKED_MROPE_MODELS", frozenset())
    monkeypatch.setattr(forward, "_fallback_logged", set())
    with caplog.at_level("WARNING", logger=forward.__name__):
        got = engine.infer_batch(batch).batch["log_probs"]
    assert "qwen2_vl takes multimodal rotary positions that are not known to pack" in caplog.text
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)


def test_bf16_is_close_to_fp32_and_trains(vlm_dirs):
    """compute_dtype=bfloat16: log-probs within twice the Hugging Face model's own
    bf16-vs-fp32 gap of the fp32 engine's; one finite step with fp32 master weights."""
    path = vlm_dirs["qwen2_vl"]
    batch = vlm_rl_batch(path, num_seqs=4, response_len=4, seed=3)
    mask = batch.batch["response_mask"].bool()
    hf = {d: _reference_log_probs(path, batch, d) for d in (torch.float32, torch.bfloat16)}
    gap = float((hf[torch.float32] - hf[torch.bfloat16])[mask].abs().max())
    assert gap > 1e-4
    out = {}
    for dtype in ("float32", "bfloat16"):
        engine = _engine(path, compute_dtype=dtype)
        out[dtype] = engine.infer_batch(batch, outputs=("log_probs",)).batch["log_probs"]
    diff = float((out["bfloat16"] - out["float32"])[mask].abs().max())
    assert 1e-5 < diff <= 2 * gap, (diff, gap)
    before = {n: t.clone() for b in engine.export_weights() for n, t in b}
    metrics = engine.train_batch(batch, pg_loss)  # the bf16 engine
    after = {n: t.clone() for b in engine.export_weights() for n, t in b}
    assert metrics["skipped"] == 0 and torch.isfinite(torch.tensor(metrics["loss"]))
    assert _changed(before, after, "model.language_model.")
    assert {t.dtype for t in after.values()} == {torch.float32}
    opt = engine.optimizer
    assert {p.dtype for g in opt.param_groups for p in g["params"]} == {torch.float32}
    moments = {v.dtype for s in opt.state.values() for k, v in s.items() if k != "step"}
    assert moments == {torch.float32}

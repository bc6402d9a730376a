"""``rl export``: a Hugging Face model directory from a training checkpoint of any engine.

``path`` is a trainer checkpoint (``checkpoints/step_N``), a run directory (its latest
checkpoint) or a bare engine checkpoint with ``model=`` naming its HF directory. Weights come
from the engine class's `read_checkpoint_weights` (``rl.engines`` registry). The output
(weights, config, generation config, tokenizer) is written to ``OUT.partial`` and renamed.
A LoRA checkpoint becomes a PEFT adapter directory, or with ``merge_lora`` a merged model. A
builder model (``rl_model.json``, e.g. a VLA policy) exports its HF part as a model and its
other tensors into the json's ``extra_file``; its adapters are always merged.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CheckpointSource", "export_checkpoint", "locate_checkpoint"]

TRAINER_STATE = "trainer_state.json"
HF_FILES_DIR = "huggingface"
RL_MODEL_META = "rl_model.json"  # a builder model's export settings (rl_core.engine.models)
ENGINE_META = "meta.json"
DEFAULT_EXTRA_FILE = "extra_weights.safetensors"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class CheckpointSource:
    """Where an export reads from: the engine checkpoint, its engine, the HF files."""

    engine_dir: Path
    engine: str
    hf_dir: Path
    step: int | None
    value_model: bool = False
    lora: dict[str, Any] | None = None


def copy_hf_metadata(model_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> None:
    """Copy a model directory's config, tokenizer and generation config (not its weights)."""
    src, out = Path(model_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for item in sorted(src.iterdir()):
        if item.is_file() and not (
            item.name.endswith(_WEIGHT_SUFFIXES) or item.name in _WEIGHT_INDEXES
        ):
            shutil.copy2(item, out / item.name)


def _read_json(path: Path) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def locate_checkpoint(path: str | os.PathLike[str], model: str | None = None) -> CheckpointSource:
    """Resolve ``path`` (trainer checkpoint, run directory or engine checkpoint)."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"rl export: checkpoint {str(root)!r} is not a directory")
    for pointer in (root / "latest", root / "checkpoints" / "latest"):
        if pointer.is_file() and not (root / TRAINER_STATE).is_file():
            root = pointer.parent / pointer.read_text().strip()
            break
    if (root / TRAINER_STATE).is_file():
        state = _read_json(root / TRAINER_STATE)
        engine_dir = root / "actor"
        hf_dir = root / HF_FILES_DIR
        if model is not None:
            hf_dir = Path(model)
        elif not (hf_dir / "config.json").is_file():
            recorded = state.get("model_path")
            if not recorded:
                raise FileNotFoundError(
                    f"rl export: trainer checkpoint {str(root)!r} records no model files "
                    f"(no {HF_FILES_DIR}/config.json, no model_path): pass --model HF_DIR"
                )
            hf_dir = Path(recorded)
        engine = state.get("engine")
        step = state.get("global_step")
    else:
        engine_dir, engine, step = root, None, None
        if model is None:
            raise ValueError(
                f"rl export: {str(root)!r} is an engine checkpoint without a trainer state "
                f"({TRAINER_STATE}): pass --model HF_DIR, the model it was trained from"
            )
        hf_dir = Path(model)
    meta_file = engine_dir / ENGINE_META
    meta = _read_json(meta_file) if meta_file.is_file() else {}
    engine = engine or meta.get("engine")
    if not engine:
        raise ValueError(
            f"rl export: cannot tell which engine wrote {str(engine_dir)!r} (no 'engine' in "
            f"{TRAINER_STATE} or {ENGINE_META})"
        )
    if not (hf_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"rl export: model directory {str(hf_dir)!r} has no config.json: expected the "
            "Hugging Face directory the checkpoint was trained from"
        )
    return CheckpointSource(
        engine_dir=engine_dir,
        engine=str(engine),
        hf_dir=hf_dir,
        step=step if step is not None else meta.get("step"),
        value_model=bool(meta.get("value_model", False)),
        lora=meta.get("lora") or None,
    )


def read_weights(source: CheckpointSource, merge_lora: bool = True) -> dict[str, Any]:
    """The checkpoint's weights via the engine's `read_checkpoint_weights` (a LoRA
    checkpoint: merged, or its adapter tensors only with ``merge_lora=False``)."""
    from rl_core.engine import ENGINES

    engine_cls = ENGINES.get(source.engine)
    reader = getattr(engine_cls, "read_checkpoint_weights", None)
    if reader is None:
        raise NotImplementedError(
            f"rl export: engine {source.engine!r} ({engine_cls!r}) has no "
            "read_checkpoint_weights: it is not a TrainEngine class that can be exported"
        )
    if source.lora and not merge_lora:
        return reader(str(source.engine_dir), merge_lora=False)
    return reader(str(source.engine_dir))


def _hf_model(source: CheckpointSource, weights: dict[str, Any], dtype: str) -> Any:
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForTokenClassification,
        GenerationConfig,
    )

    if dtype not in _DTYPES:
        raise ValueError(f"rl export: dtype={dtype!r} is invalid: expected one of {_DTYPES}")
    config = AutoConfig.from_pretrained(source.hf_dir)
    if source.value_model:
        config.num_labels = 1
    torch_dtype = next(iter(weights.values())).dtype if dtype == "auto" else getattr(torch, dtype)
    auto = AutoModelForTokenClassification if source.value_model else AutoModelForCausalLM
    if not source.value_model and getattr(config, "vision_config", None) is not None:
        from transformers import AutoModelForImageTextToText

        auto = AutoModelForImageTextToText
    with torch.device("meta"):
        model = auto.from_config(config, dtype=torch_dtype)
    weights = {k: v.to(torch_dtype) for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ValueError(
            f"rl export: the checkpoint's weights do not fit {type(model).__name__} of "
            f"{str(source.hf_dir)!r}: missing {sorted(set(missing) - tied)[:8]}, "
            f"unexpected {sorted(unexpected)[:8]}"
        )
    model.tie_weights()
    if (source.hf_dir / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(source.hf_dir)
    return model


def _save_adapter(source: CheckpointSource, adapter: dict[str, Any], out: Path) -> None:
    """A PEFT adapter directory: ``adapter_model.safetensors`` + ``adapter_config.json``."""
    from safetensors.torch import save_file

    lora = source.lora or {}
    targets = list(lora["target_modules"])
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(source.hf_dir),
        "r": lora["rank"],
        "lora_alpha": lora["alpha"],
        "lora_dropout": lora["dropout"],
        "target_modules": "all-linear" if targets == ["all-linear"] else targets,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=1))
    save_file({k: v.contiguous() for k, v in adapter.items()}, out / "adapter_model.safetensors")


def _split_builder_weights(
    hf_dir: Path, weights: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(HF weights, other tensors, their file name) of a builder model (``rl_model.json``):
    tensors under ``hf_prefix`` lose it, the rest go to ``extra_file``."""
    meta_file = hf_dir / RL_MODEL_META
    if not meta_file.is_file():
        return weights, {}, DEFAULT_EXTRA_FILE
    meta = _read_json(meta_file)
    prefix = str(meta.get("hf_prefix", ""))
    hf = {k.removeprefix(prefix): v for k, v in weights.items() if k.startswith(prefix)}
    extra = {k: v for k, v in weights.items() if not k.startswith(prefix)}
    return hf, extra, str(meta.get("extra_file", DEFAULT_EXTRA_FILE))


def export_checkpoint(
    checkpoint: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    model: str | None = None,
    dtype: str = "auto",
    overwrite: bool = False,
    merge_lora: bool = False,
) -> Path:
    """Write ``checkpoint`` to ``out_dir`` as an HF model (or PEFT adapter, see module)."""
    source = locate_checkpoint(checkpoint, model)
    out = Path(out_dir).expanduser().resolve()
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(
            f"rl export: output directory {str(out)!r} exists and is not empty "
            "(choose another or pass --overwrite)"
        )
    # a builder model has no adapter-only form
    built = (source.hf_dir / RL_MODEL_META).is_file()
    as_adapter = bool(source.lora) and not merge_lora and not built
    weights = read_weights(source, merge_lora=not as_adapter)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    copy_hf_metadata(source.hf_dir, partial)
    if as_adapter:
        if dtype != "auto":
            import torch

            weights = {k: v.to(getattr(torch, dtype)) for k, v in weights.items()}
        _save_adapter(source, weights, partial)
    else:
        weights, extra, extra_file = _split_builder_weights(source.hf_dir, weights)
        _hf_model(source, weights, dtype).save_pretrained(partial)
        if extra:
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in extra.items()}, partial / extra_file)
    provenance = {
        "checkpoint": str(source.engine_dir),
        "engine": source.engine,
        "step": source.step,
        "base_model_files": str(source.hf_dir),
        "format": "peft-adapter" if as_adapter else "model",
    }
    (partial / "rl_export.json").write_text(json.dumps(provenance, indent=1))
    if out.exists():
        shutil.rmtree(out)
    os.replace(partial, out)
    return out

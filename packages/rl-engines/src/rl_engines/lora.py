"""LoRA adapters with PEFT: wrap a model, merge adapters into full weights, extract them.

PEFT names the parameters of a wrapped model ``base_model.model.<hf name>``; a targeted
linear layer ``<m>`` holds its frozen weight as ``<m>.base_layer.weight`` and the adapter
as ``<m>.lora_A.<adapter>.weight`` [r, in] and ``<m>.lora_B.<adapter>.weight`` [out, r].
The merged weight is ``W + scaling * B @ A`` with ``scaling = alpha / rank``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from rl_core.engine import LoRAConfig

__all__ = ["ADAPTER", "adapter_tensors", "apply_lora", "merge_lora_weights", "peft_config"]

ADAPTER = "default"
PEFT_PREFIX = "base_model.model."


def peft_config(lora: LoRAConfig) -> Any:
    """The `peft.LoraConfig` of a `LoRAConfig` (causal LM)."""
    try:
        from peft import LoraConfig
    except ImportError as exc:
        raise ImportError(
            "ModelConfig.lora is set but PEFT is not installed: pip install 'rl-engines[lora]'"
        ) from exc
    targets = lora.target_modules
    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        target_modules="all-linear" if list(targets) == ["all-linear"] else list(targets),
        lora_dropout=lora.dropout,
        bias="none",
        task_type="CAUSAL_LM",
    )


def apply_lora(model: nn.Module, lora: LoRAConfig) -> nn.Module:
    """Wrap ``model`` with fresh adapters (base weights frozen, ``B = 0``: same outputs)."""
    from peft import get_peft_model

    return get_peft_model(model, peft_config(lora))


def _split(name: str) -> tuple[str, str | None]:
    """(HF name, None) of a base tensor, or (module name, "A"/"B") of an adapter tensor."""
    name = name.removeprefix(PEFT_PREFIX)
    for part in ("A", "B"):
        marker = f".lora_{part}."
        if marker in name:
            return name.split(marker)[0], part
    if ".lora_" in name:
        raise ValueError(f"LoRA tensor {name!r} is not supported (only lora_A / lora_B)")
    return name.replace(".base_layer.", "."), None


def merge_lora_weights(
    named: Iterable[tuple[str, Tensor]], scaling: float
) -> Iterator[tuple[str, Tensor]]:
    """Stream ``(name, tensor)`` of a PEFT model's full state into Hugging Face names with
    every adapter merged into its base weight (held back until both factors arrived)."""
    pending: dict[str, dict[str, Tensor]] = {}

    def ready(module: str) -> Iterator[tuple[str, Tensor]]:
        parts = pending[module]
        if {"W", "A", "B"} <= set(parts):
            del pending[module]
            base = parts["W"]
            delta = parts["B"].to(torch.float32) @ parts["A"].to(torch.float32)
            yield f"{module}.weight", (base.to(torch.float32) + scaling * delta).to(base.dtype)

    for name, tensor in named:
        key, part = _split(name)
        if part is None:
            module = key.removesuffix(".weight")
            if ".base_layer." in name and name.endswith(".weight"):
                pending.setdefault(module, {})["W"] = tensor
                yield from ready(module)
            else:
                yield key, tensor
        else:
            pending.setdefault(key, {})[part] = tensor
            yield from ready(key)
    if pending:
        raise ValueError(f"LoRA layers without base weight or both factors: {sorted(pending)}")


def adapter_tensors(named: Iterable[tuple[str, Tensor]]) -> dict[str, Tensor]:
    """Only the adapter tensors, under the names PEFT saves (``adapter_model.safetensors``:
    ``base_model.model.<m>.lora_A.weight``, no adapter name)."""
    out = {}
    for name, tensor in named:
        if ".lora_A." in name or ".lora_B." in name:
            full = name if name.startswith(PEFT_PREFIX) else PEFT_PREFIX + name
            out[full.replace(f".{ADAPTER}.", ".")] = tensor
    return out

"""Typed options of the vLLM and SGLang rollout backends (``RolloutConfig.engine_kwargs``).

The fields below are validated here (an error names the key, its value and what was
expected); every other key of ``engine_kwargs`` is passed unchanged to the library's own
engine arguments (``vllm.AsyncEngineArgs`` / ``sglang.Engine``), which check them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rl_core.config import dataclass_from_dict, is_int, is_real
from rl_core.engine import DEFAULT_BUCKET_BYTES

__all__ = ["SGLangOptions", "VLLMOptions"]

OptionsT = TypeVar("OptionsT", bound="_ServerOptions")
WEIGHT_TRANSFERS = ("auto", "ipc", "nccl", "files")
SGLANG_WEIGHT_TRANSFERS = ("auto", "nccl")


@dataclass(frozen=True)
class _ServerOptions:
    """What vLLM and SGLang share.

    ``gpu_memory_utilization``: the fraction of accelerator memory the engine may take
    (weights + KV cache; SGLang's ``mem_fraction_static``). ``enforce_eager``: no CUDA
    graphs (SGLang's ``disable_cuda_graph``). ``enable_prefix_caching``: reuse the KV cache
    of shared prompt prefixes (SGLang's radix cache). ``weight_bucket_bytes``: the size of
    one weight-update bucket; ``update_timeout_s`` bounds one weight update.
    ``engine_args``: the other keys, for the library.
    """

    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    weight_bucket_bytes: int = DEFAULT_BUCKET_BYTES
    update_timeout_s: float = 600.0
    engine_args: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_kwargs(cls: type[OptionsT], kwargs: Mapping[str, Any] | None) -> OptionsT:
        """Split ``engine_kwargs`` into the typed fields and the library's own arguments."""
        kwargs = dict(kwargs or {})
        own = {f.name for f in dataclasses.fields(cls)} - {"engine_args"}
        if "engine_args" in kwargs:
            raise ValueError(
                "RolloutConfig.engine_kwargs['engine_args'] is invalid: expected the library's "
                "arguments directly in engine_kwargs"
            )
        typed = {k: kwargs.pop(k) for k in list(kwargs) if k in own}
        options = dataclass_from_dict(cls, typed, "RolloutConfig.engine_kwargs")
        return dataclasses.replace(options, engine_args=kwargs).validate()

    def _bad(self, name: str, expected: str) -> ValueError:
        return ValueError(
            f"RolloutConfig.engine_kwargs['{name}']={getattr(self, name)!r} is invalid: "
            f"expected {expected}"
        )

    def validate(self: OptionsT) -> OptionsT:
        value = self.gpu_memory_utilization
        if not is_real(value) or not 0 < value <= 1:
            raise self._bad("gpu_memory_utilization", "a number in (0, 1]")
        for name in ("enforce_eager", "enable_prefix_caching"):
            if not isinstance(getattr(self, name), bool):
                raise self._bad(name, "true or false")
        if not is_int(self.weight_bucket_bytes) or self.weight_bucket_bytes < 1:
            raise self._bad("weight_bucket_bytes", "an integer number of bytes >= 1")
        if not is_real(self.update_timeout_s) or self.update_timeout_s <= 0:
            raise self._bad("update_timeout_s", "a number of seconds > 0")
        return self


@dataclass(frozen=True)
class VLLMOptions(_ServerOptions):
    """The vllm backend's options; ``weight_transfer``: ``auto`` (``ipc`` on accelerators,
    ``files`` on CPU), ``ipc`` (colocated), ``nccl`` (a split pool) or ``files``."""

    weight_transfer: str = "auto"

    def validate(self) -> VLLMOptions:
        super().validate()
        if self.weight_transfer not in WEIGHT_TRANSFERS:
            raise self._bad("weight_transfer", f"one of {WEIGHT_TRANSFERS}")
        return self


@dataclass(frozen=True)
class SGLangOptions(_ServerOptions):
    """The sglang backend's options; ``weight_transfer``: ``auto`` (tensors in process,
    ``update_weights_from_tensor``) or ``nccl`` (a split pool receives the trainer's
    broadcasts)."""

    weight_transfer: str = "auto"

    def validate(self) -> SGLangOptions:
        super().validate()
        if self.weight_transfer not in SGLANG_WEIGHT_TRANSFERS:
            raise self._bad("weight_transfer", f"one of {SGLANG_WEIGHT_TRANSFERS}")
        return self

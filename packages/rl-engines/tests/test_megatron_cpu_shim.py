"""The CPU shim: what it redirects, that the RNG tracker forks the CPU generator like
Megatron's CUDA tracker does, and that uninstalling restores everything."""

from __future__ import annotations

import pytest
import torch

from rl_engines.megatron import cpu_shim

pytestmark = pytest.mark.megatron


def test_shim_redirects_and_restores():
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.tensor_parallel import random as mp_random

    originals = (torch.cuda.current_device, torch.cuda.synchronize, schedules.torch)
    cpu_shim.install_cpu_shim()
    try:
        assert cpu_shim.cpu_shim_installed()
        assert torch.cuda.current_device() == "cpu"
        assert torch.cuda.synchronize() is None
        counter = schedules.torch.zeros([], dtype=torch.int, device="cuda")
        assert counter.device.type == "cpu"
        mp_random.model_parallel_cuda_manual_seed(
            123, tp_rank=0, ep_rank=0, etp_rank=0, force_reset_rng=True
        )
        tracker = mp_random.get_cuda_rng_tracker()
        torch.manual_seed(0)
        outside = torch.get_rng_state()
        with tracker.fork():
            a = torch.rand(3)
        assert torch.equal(torch.get_rng_state(), outside)  # the default stream is untouched
        with tracker.fork():
            b = torch.rand(3)
        assert not torch.equal(a, b)  # the tracked stream advanced
        # the model-parallel stream is seeded with seed + 2718 + tp_rank, as in Megatron
        torch.manual_seed(123 + 2718)
        assert torch.equal(a, torch.rand(3))
    finally:
        cpu_shim.uninstall_cpu_shim()
    assert not cpu_shim.cpu_shim_installed()
    assert (torch.cuda.current_device, torch.cuda.synchronize, schedules.torch) == originals

"""`rl_core.testing.standin`: the host-backed stand-in accelerator behaves like a device that
is not the host (mixing with CPU tensors raises, moves are real, autograd and a gloo
all-reduce work, memory is counted), in a spawned process (it changes process-wide state)."""

from __future__ import annotations

import os

import standin_cases  # beside this file (conftest puts it on sys.path): spawned ranks import it
import torch

from rl_core.testing.spawn import SpawnRunner


def test_standin_device_behaves_like_an_accelerator(tmp_path):
    with SpawnRunner(1, timeout_s=120.0) as runner:
        runner.run(standin_cases.behaviour, str(tmp_path))


def test_standin_collectives_refuse_host_tensors_like_nccl(tmp_path):
    """Every covered call on a device group refuses a host tensor, naming the operation,
    the rank and the device; device tensors and explicit gloo groups work."""
    with SpawnRunner(2, timeout_s=120.0) as runner:
        results = runner.run(standin_cases.strict_collectives, str(tmp_path))
    expected = {"all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
                "reduce_scatter_tensor", "reduce_scatter", "all_to_all_single", "all_to_all",
                "send", "recv", "isend", "irecv", "batch_isend_irecv"}  # fmt: skip
    assert all(set(r["refused"]) == expected for r in results), results


def test_install_is_not_done_in_this_process():
    """The suite's own process stays a plain CPU process."""
    from rl_core.platform import PLATFORMS

    assert "standin" not in PLATFORMS.names() or os.environ.get("RL_PLATFORM") != "standin"
    assert torch.ones(1).device.type == "cpu"

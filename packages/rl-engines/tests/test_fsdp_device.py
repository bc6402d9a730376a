"""The rl-core device contract on the FSDP2 engine, on the host-backed stand-in accelerator
(`rl_core.testing.standin`): runs in `nox -s tests-device`."""

from __future__ import annotations

import megatron_models
import pytest
import replay_cases
import torch

from rl_core.testing.spawn import SpawnRunner
from rl_core.testing.train_engine import TrainEngineDeviceConformance

pytestmark = pytest.mark.device


class TestFSDPDevice(TrainEngineDeviceConformance):
    engine_name = "fsdp"
    engine_options = {"engine_kwargs": {"use_remove_padding": False}}


def test_router_replay_on_standin_matches_the_host_run(tmp_path):
    """Router replay at world size 2 on the stand-in (NCCL-strict groups): the recorded
    experts reach the device with the micro-batch, and the replayed log-probs and update
    equal those of the same run on the CPU platform."""
    moe = megatron_models.save_model(str(tmp_path / "moe"), "qwen3_moe")
    options = {"engine_kwargs": {"use_remove_padding": False}}
    with SpawnRunner(2, timeout_s=300.0) as runner:
        device = runner.run(replay_cases.replayed_update_on_standin, "fsdp", moe, options)
    with SpawnRunner(2, timeout_s=300.0, env={"RL_PLATFORM": "cpu"}) as runner:
        host = runner.run(replay_cases.replayed_update, "fsdp", moe, options)
    for d, h in zip(device, host):
        for key in ("log_probs", "log_probs_after"):
            torch.testing.assert_close(d[key], h[key], atol=1e-5, rtol=1e-5, msg=key)
        assert abs(d["metrics"]["loss"] - h["metrics"]["loss"]) < 1e-5

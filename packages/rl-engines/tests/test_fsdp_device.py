"""The rl-core device contract on the FSDP2 engine, on the host-backed stand-in accelerator
(`rl_core.testing.standin`): runs in `nox -s tests-device`."""

from __future__ import annotations

import pytest

from rl_core.testing.train_engine import TrainEngineDeviceConformance

pytestmark = pytest.mark.device


class TestFSDPDevice(TrainEngineDeviceConformance):
    engine_name = "fsdp"
    engine_options = {"engine_kwargs": {"use_remove_padding": False}}

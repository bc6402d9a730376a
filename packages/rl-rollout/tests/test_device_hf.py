"""The rl-core rollout device contract on the `hf` engine, on the host-backed stand-in
accelerator (`rl_core.testing.standin`): runs in `nox -s tests-device`."""

from __future__ import annotations

import pytest

from rl_core.testing.rollout_engine import RolloutEngineDeviceConformance

pytestmark = pytest.mark.device


class TestHFDevice(RolloutEngineDeviceConformance):
    backend = "hf"

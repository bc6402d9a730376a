"""`RoleGroups.shutdown` after a stop signal: the workers may still be running a step, and
the colocated rollout's shutdown call waits behind it. The wait is bounded, then the
processes are killed (it used to wait for the step, past the CLI's grace period)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from rl_algos.trainer import placement
from rl_core.single_controller import Dispatch, ResourcePool, Worker, register

pytestmark = pytest.mark.ray


class BusyActor(Worker):
    """A stand-in actor role: a long step, and the rollout shutdown the trainer calls."""

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def step(self, seconds: float) -> int:
        time.sleep(seconds)
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def shutdown_rollout(self) -> None:
        return None

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture(scope="module")
def ray_session():
    import ray

    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    ray.init(num_cpus=2, include_dashboard=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    ray.shutdown()


def test_shutdown_does_not_wait_behind_a_step_in_flight(ray_session, monkeypatch):
    from rl_core.single_controller.ray import RayWorkerGroup

    monkeypatch.setattr(placement, "ROLLOUT_SHUTDOWN_S", 2.0)
    group = RayWorkerGroup(ResourcePool([1], cpus_per_process=0.5), BusyActor, name_prefix="busy")
    (pid,) = group.pid()
    group.step(120.0)  # a step in flight, as when SIGTERM arrives mid-step
    groups = placement.RoleGroups(
        actor=group, critic=None, reward_model=None, uses_reference=False, dp_size=1
    )
    start = time.monotonic()
    groups.shutdown()
    took = time.monotonic() - start
    assert 1.5 < took < 10.0, f"shutdown took {took:.1f} s with a 2 s rollout bound"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the busy process was killed, not waited for
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"worker {pid} still runs after the shutdown")

"""In-memory snapshots: the host copy (`rl_core.engine.snapshot`) and the holders that keep
it outside the owning process (`rl_core.single_controller.ray.snapshots`).

The holder cases run on an embedded Ray: a worker sends its snapshot and is killed with
SIGKILL; the copy is still there, byte for byte, and a new process fetches it. A holder
keeps two snapshots per rank, forgets a rewound timeline, says which ranks a step lacks,
and a dead holder is replaced.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import pytest
import torch

from rl_core.engine import HostSnapshot, SnapshotView
from rl_core.engine.snapshot import layout_from, unpack


def _view(step: int) -> SnapshotView:
    return SnapshotView(
        {"step": step, "rng": torch.get_rng_state()},
        {
            "w": torch.arange(6, dtype=torch.float32).reshape(2, 3) + step,
            "m": torch.full((5,), step, dtype=torch.bfloat16),
            "n": torch.tensor(step, dtype=torch.int64),
        },
    )


def test_the_host_copy_is_a_copy_of_the_moment_it_was_captured():
    view = _view(1)
    host = HostSnapshot()
    host.capture(view)
    host.wait_copied()
    for tensor in view.tensors.values():
        tensor.add_(100)  # training goes on
    got = host.tensors()
    assert torch.equal(got["w"], _view(1).tensors["w"]) and got["m"].dtype == torch.bfloat16
    assert got["n"].shape == () and int(got["n"]) == 1
    first = host.buffer
    host.capture(_view(2))  # same layout: the buffer is reused
    host.wait_copied()
    assert host.buffer is first and int(host.tensors()["n"]) == 2
    # through plain data (another process) and back
    again = unpack(layout_from(host.describe()), torch.from_numpy(host.buffer.numpy().copy()))
    assert all(torch.equal(again[k], host.tensors()[k]) for k in again)
    with pytest.raises(ValueError, match="flat uint8 tensor of at least"):
        unpack(host.layout, host.buffer[:8])


# ---- holders (Ray) ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_session():
    import ray

    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    ray.shutdown()


class _Owner:
    """A process that takes and sends a snapshot (a training rank's role)."""

    def pid(self) -> int:
        return os.getpid()

    def send(self, target, role: str, rank: int, step: int) -> int:
        import ray

        host = HostSnapshot()
        host.capture(_view(step))
        host.wait_copied()
        node = ray.get_runtime_context().get_node_id()
        meta = {"state": host.state, "layout": host.describe()}
        return target.send(role, rank, node, step, meta, host.buffer.numpy())

    def fetch(self, target, role: str, rank: int, step: int) -> dict:
        meta, data = target.fetch(role, rank, step)
        tensors = unpack(layout_from(meta["layout"]), torch.from_numpy(np.array(data)))
        return {"step": meta["state"]["step"], **tensors}


@pytest.mark.ray
def test_a_snapshot_outlives_the_process_that_sent_it(ray_session):
    ray = ray_session
    from rl_core.single_controller.ray.snapshots import SnapshotStore

    store = SnapshotStore()
    target = store.target([ray.get_runtime_context().get_node_id()])
    owner_cls = ray.remote(num_cpus=0)(_Owner)
    owner = owner_cls.remote()
    pid = ray.get(owner.pid.remote())
    for step in (1, 2, 3):
        assert ray.get(owner.send.remote(target, "actor", 0, step)) > 0
    ray.get(owner.send.remote(target, "actor", 1, 3))
    os.kill(pid, signal.SIGKILL)  # the owner is gone: the holder's copy is its own
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(owner.pid.remote(), timeout=60)
    fresh = owner_cls.remote()
    got = ray.get(fresh.fetch.remote(target, "actor", 0, 3))
    assert got["step"] == 3 and torch.equal(got["w"], _view(3).tensors["w"])
    held = store.held_steps()
    assert held[("actor", 0)] == {2, 3} and held[("actor", 1)] == {3}  # two per rank
    assert store.missing({"actor": 2}, 3) == [] and store.missing({"actor": 2}, 2) == [("actor", 1)]
    assert store.nbytes() > 0
    store.drop_after(2)  # a rewind: step 3 belongs to a timeline that will not happen
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and store.missing({"actor": 1}, 3) == []:
        time.sleep(0.1)
    assert store.held_steps()[("actor", 0)] == {2}
    with pytest.raises(LookupError, match="no snapshot of 'actor' rank 0 at step 3"):
        target.fetch("actor", 0, 3)
    # a dead holder is forgotten, and the next target starts a new one
    node = next(iter(target.holders))
    ray.kill(target.holders[node])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and store.held_steps():
        time.sleep(0.1)
    assert store.held_steps() == {}
    assert store.target([node]).holders[node] != target.holders[node]
    store.shutdown()

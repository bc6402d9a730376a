"""A rank stuck in a collective: the worker host names it (`WorkerHungError` with the role,
rank and operation) once its process group's time-out runs out, and on Ray the heartbeat,
which still gets answers from such a rank (the wait releases the GIL), does not mistake it
for a frozen process; the ranks of the collective come back as one error."""

from __future__ import annotations

import datetime
import os
import pickle
import sys
import time

import pytest
import torch

from rl_core.single_controller import Dispatch, ResourcePool, Worker, WorkerHungError, register
from rl_core.single_controller.host import WorkerHost, collective_timeout
from rl_core.single_controller.worker import WorkerInfo

GLOO = (
    "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
    "10000ms for recv operation to complete"
)
NCCL = (
    "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
    "OpType=ALLREDUCE, NumelIn=2, NumelOut=2, Timeout(ms)=300000) ran for 300004 ms"
)


def test_collective_timeouts_are_recognised_through_wrapping():
    assert collective_timeout(RuntimeError(GLOO)) == ("recv", 10.0)
    assert collective_timeout(RuntimeError(NCCL)) == ("allreduce", 300.0)
    try:
        try:
            raise RuntimeError(GLOO)
        except RuntimeError as exc:  # an engine naming what it was reducing
            raise RuntimeError("rank 0: all-reduce of the loss failed") from exc
    except RuntimeError as wrapped:
        assert collective_timeout(wrapped) == ("recv", 10.0)
    assert collective_timeout(RuntimeError("Connection closed by peer")) is None
    assert collective_timeout(TimeoutError("the reward timed out")) is None


def test_the_host_turns_a_collective_timeout_into_a_named_hung_error():
    host = WorkerHost()
    host._info = WorkerInfo("actor", 1, 2, 1, 2, "127.0.0.1", 1234, "node", "127.0.0.1")
    error = host.wrap_error(RuntimeError(GLOO), "actor", "update_actor")
    assert isinstance(error, WorkerHungError)
    assert (error.role, error.ranks, error.method) == ("actor", [1], "update_actor")
    assert (error.operation, error.timeout_s) == ("recv", 10.0)
    assert str(error) == (
        "'actor' rank(s) [1] stuck in a collective (recv) during update_actor(): it timed out "
        "after 10 s waiting for peers that never joined (a rank hung or lost)"
    )
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) and again.operation == "recv"
    other = host.wrap_error(ValueError("bad batch"), "actor", "update_actor")
    assert not isinstance(other, WorkerHungError) and other.exc_type == "ValueError"


class _Peers(Worker):
    """Two ranks of one gloo group; in `deadlock` rank 1 waits for a message rank 0 never
    sends while rank 0 waits in an all-reduce for rank 1."""

    @register(Dispatch.ONE_TO_ALL)
    def join(self, timeout_s: float) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))

    @register(Dispatch.ONE_TO_ALL)
    def deadlock(self) -> None:
        import torch.distributed as dist

        if self.rank == 1:
            dist.recv(torch.zeros(1), src=0)
        else:
            dist.all_reduce(torch.zeros(1))


@pytest.mark.ray
def test_a_deadlocked_collective_fails_the_call_naming_its_ranks():
    import ray

    from rl_core.single_controller.ray import RayWorkerGroup

    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        pool = ResourcePool([2], cpus_per_process=0.5)
        # a heartbeat much shorter than the collective's time-out: the waiting ranks answer it
        group = RayWorkerGroup(pool, _Peers, heartbeat_timeout_s=2.0, call_timeout_s=120)
        group.join(4.0)
        start = time.monotonic()
        with pytest.raises(WorkerHungError) as info:
            group.deadlock()
        elapsed = time.monotonic() - start
        error = info.value
        # both ranks time out together and come back as one error (unless one of them was
        # scheduled far later than the other: then the first one alone)
        assert error.ranks in ([0, 1], [0], [1]) and error.operation == "recv", error
        assert error.method == "deadlock" and "stuck in a collective (recv)" in str(error)
        assert 4.0 <= elapsed < 60, elapsed  # the group's time-out, not the heartbeat's (2 s)
        group.shutdown()
    finally:
        ray.shutdown()

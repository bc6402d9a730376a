"""Dispatch modes, registration, errors and colocation on LocalWorkerGroup (no Ray)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from rl_core import DataProto
from rl_core.single_controller import (
    ClassWithInitArgs,
    Dispatch,
    DispatchError,
    Execute,
    LocalWorkerGroup,
    ResourcePool,
    Worker,
    WorkerError,
    WorkerInfo,
    create_colocated_worker_cls,
    register,
    register_dispatch_mode,
)
from rl_core.single_controller.dispatch import dp_rows


class Echo(Worker):
    """Returns what it received, tagged with its rank."""

    def __init__(self, offset: int = 0):
        self.offset = offset
        self.calls = 0

    @register(Dispatch.ONE_TO_ALL)
    def one_to_all(self, x, y=0):
        self.calls += 1
        return (self.rank, x + y + self.offset)

    @register(Dispatch.RANK_ZERO)
    def rank_zero(self, x):
        self.calls += 1
        return (self.rank, x)

    @register(Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def only_rank_zero(self):
        self.calls += 1
        return self.rank

    @register(Dispatch.ALL_TO_ALL)
    def all_to_all(self, x, y):
        self.calls += 1
        return (self.rank, x, y)

    @register(Dispatch.DP_COMPUTE)
    def dp_compute(self, items):
        self.calls += 1
        return [v * 10 for v in items]

    @register(Dispatch.DP_COMPUTE_PROTO)
    def tag_rows(self, data: DataProto) -> DataProto:
        self.calls += 1
        out = DataProto.from_dict(
            {"x": data.batch["x"].clone(), "rank": torch.full((len(data),), self.rank)},
            {"uid": data.non_tensor_batch["uid"]},
            dict(data.meta_info),
        )
        return out

    @register(Dispatch.DP_COMPUTE_PROTO, pad=False)
    def tag_rows_no_pad(self, data: DataProto) -> DataProto:
        self.calls += 1
        return DataProto.from_dict({"n": torch.full((len(data),), len(data))})

    @register()
    def call_count(self):
        return self.calls

    @register()
    def fail(self, message):
        if self.rank == 1:
            raise KeyError(message)
        return self.rank

    def not_registered(self):
        return 1


def batch(n: int) -> DataProto:
    return DataProto.from_dict(
        {"x": torch.arange(n, dtype=torch.float32)},
        {"uid": [f"u{i}" for i in range(n)]},
        {"temperature": 0.7},
    )


@pytest.fixture
def group():
    return LocalWorkerGroup(ResourcePool([3]), ClassWithInitArgs(Echo, offset=100))


def test_one_to_all_rank_zero_and_execute_rank_zero(group):
    assert group.one_to_all(1, y=2) == [(0, 103), (1, 103), (2, 103)]
    assert group.rank_zero(7) == (0, 7)
    assert group.only_rank_zero() == 0
    assert group.call_count() == [3, 1, 1]  # rank 0 ran all three, ranks 1-2 only the first


def test_all_to_all_and_dp_compute_split_lists_by_rank(group):
    assert group.all_to_all(["a", "b", "c"], y=(1, 2, 3)) == [(0, "a", 1), (1, "b", 2), (2, "c", 3)]
    assert group.dp_compute([[1], [2, 3], []]) == [[10], [20, 30], []]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 10])
def test_dp_compute_proto_pads_splits_concatenates_and_unpads(group, n):
    out = group.tag_rows(batch(n))
    assert torch.equal(out.batch["x"], torch.arange(n, dtype=torch.float32))
    assert list(out.non_tensor_batch["uid"]) == [f"u{i}" for i in range(n)]
    assert out.meta_info == {"temperature": 0.7}
    # padded to a multiple of 3, equal chunks: rank r holds rows [r*k, (r+1)*k)
    k = -(-n // 3)
    assert out.batch["rank"].tolist() == [i // k for i in range(n)]


def test_dp_compute_proto_without_padding_uses_uneven_chunks(group):
    out = group.tag_rows_no_pad(batch(7))
    assert out.batch["n"].tolist() == [3, 3, 3, 2, 2, 2, 2]
    with pytest.raises(DispatchError, match=r"has 2 rows, fewer than the 3 .* padding is disabled"):
        group.tag_rows_no_pad(batch(2))


@pytest.mark.parametrize("total", range(1, 13))
@pytest.mark.parametrize("dp_size", [1, 2, 3, 4, 5])
def test_dp_rows_matches_pad_then_chunk(total, dp_size):
    """The worker-side slicing of futures equals DataProto.pad_to_divisor + chunk."""
    data = DataProto.from_dict({"i": torch.arange(total)})
    padded, pad = data.pad_to_divisor(dp_size)
    for dp_rank, chunk in enumerate(padded.chunk(dp_size)):
        ranges, got_pad = dp_rows(total, dp_rank, dp_size, pad=True)
        rows = [i for a, b in ranges for i in range(a, b)]
        assert rows == chunk.batch["i"].tolist() and got_pad == pad
    if total >= dp_size:
        for dp_rank, chunk in enumerate(data.chunk(dp_size)):
            ranges, got_pad = dp_rows(total, dp_rank, dp_size, pad=False)
            assert [i for a, b in ranges for i in range(a, b)] == chunk.batch["i"].tolist()
            assert got_pad == 0


def test_bad_arguments_fail_on_the_driver_before_anything_runs(group):
    cases = [
        (
            lambda: group.all_to_all([1, 2], y=[1, 2, 3]),
            r"argument 0 must be a list with one element per rank \(world_size=3\), got a list of length 2",
        ),
        (lambda: group.dp_compute(5), r"DP_COMPUTE.*argument 0 must be a list.*got int 5"),
        (lambda: group.tag_rows([1, 2, 3]), r"argument 0 is list .*pass DataProtos"),
        (lambda: group.tag_rows(batch(4), 0.5), r"argument 1 is float"),
        (
            lambda: group.tag_rows(batch(4), other=batch(5)),
            r"differ in length: argument 0 has 4 rows, argument 'other' has 5",
        ),
        (lambda: group.tag_rows(batch(0)), r"argument 0 has no rows"),
        (lambda: group.tag_rows(), r"needs a DataProto argument"),
    ]
    for call, pattern in cases:
        with pytest.raises(DispatchError, match=pattern):
            call()
    assert group.call_count() == [0, 0, 0]


def test_unknown_method_names_registered_ones(group):
    with pytest.raises(
        AttributeError,
        match=r"no method 'not_registered' \(Echo.not_registered exists but is not decorated with @register\)",
    ):
        group.not_registered()
    with pytest.raises(
        AttributeError, match=r"Echo has no attribute 'nope'.*registered methods: .*tag_rows"
    ):
        group.nope()


def test_worker_error_names_role_rank_method_and_original():
    g = LocalWorkerGroup(ResourcePool([2]), Echo, name_prefix="actor")
    with pytest.raises(WorkerError) as err:
        g.fail("missing key")
    e = err.value
    assert (e.role, e.rank, e.method, e.exc_type) == ("actor", 1, "fail", "KeyError")
    assert isinstance(e.original, KeyError)
    text = str(e)
    assert "'actor' rank 1" in text and "KeyError in fail()" in text and "missing key" in text
    assert "remote traceback" in text and "raise KeyError(message)" in text


def test_register_validation_and_custom_modes():
    with pytest.raises(ValueError, match="execute_mode=RANK_ZERO works with ONE_TO_ALL"):
        register(Dispatch.DP_COMPUTE_PROTO, execute_mode=Execute.RANK_ZERO)
    with pytest.raises(TypeError, match="dispatch_mode must be"):
        register(42)

    def split_half(ctx, values):
        half = len(values) // ctx.world_size
        return [((values[r * half : (r + 1) * half],), {}) for r in range(ctx.world_size)]

    def total(ctx, outputs):
        return sum(outputs)

    register_dispatch_mode("test_split_sum", split_half, total, overwrite=True)
    with pytest.raises(ValueError, match="already registered"):
        register_dispatch_mode("test_split_sum", split_half, total)

    class Summer(Worker):
        @register(dispatch_mode="test_split_sum")
        def add(self, values):
            return sum(values) * (self.rank + 1)

        @register(dispatch_mode="no_such_mode")
        def broken(self):
            return 0

    with pytest.raises(DispatchError, match="unknown dispatch mode 'no_such_mode'"):
        LocalWorkerGroup(ResourcePool([2]), Summer)

    class GoodSummer(Worker):
        @register(dispatch_mode="test_split_sum")
        def add(self, values):
            return sum(values) * (self.rank + 1)

    g = LocalWorkerGroup(ResourcePool([2]), GoodSummer)
    assert g.add([1, 2, 3, 4]) == (1 + 2) * 1 + (3 + 4) * 2


def test_method_name_collision_is_rejected():
    class Clash(Worker):
        @register()
        def spawn(self):
            return 0

    with pytest.raises(ValueError, match=r"collides with WorkerGroup\.spawn"):
        LocalWorkerGroup(ResourcePool([1]), Clash)


class Actor(Worker):
    def __init__(self):
        self.weight = 1.0

    @register()
    def pid(self):
        return os.getpid()

    @register()
    def set_weight(self, w):
        self.weight = w

    @register(Dispatch.DP_COMPUTE_PROTO)
    def scale(self, data):
        return DataProto.from_dict({"y": data.batch["x"] * self.weight})


class Ref(Worker):
    @register()
    def pid(self):
        return os.getpid()

    @register(Dispatch.DP_COMPUTE_PROTO)
    def negate(self, data):
        return DataProto.from_dict({"z": -data.batch["x"]})


def test_colocated_roles_share_the_process_and_are_addressed_by_role():
    fused = LocalWorkerGroup(
        ResourcePool([2]), create_colocated_worker_cls({"actor": Actor, "ref": Ref})
    )
    with pytest.raises(
        AttributeError,
        match=r"colocated group 'actor\+ref' has no method 'scale': call group.spawn\(\)",
    ):
        fused.scale(batch(2))
    groups = fused.spawn()
    assert set(groups) == {"actor", "ref"}
    actor, ref = groups["actor"], groups["ref"]
    assert actor.role == "actor" and ref.role == "ref"
    assert actor.pid() == ref.pid()
    actor.set_weight(3.0)
    assert actor.scale(batch(3)).batch["y"].tolist() == [0.0, 3.0, 6.0]
    assert ref.negate(batch(3)).batch["z"].tolist() == [0.0, -1.0, -2.0]
    with pytest.raises(AttributeError, match="'ref' worker group has no method 'scale'"):
        ref.scale(batch(2))
    with pytest.raises(ValueError, match="unknown role"):
        fused.spawn({"critic"})


class Meshy(Worker):
    """2 DP x 2 TP: rank = dp * 2 + tp; tp rank 0 collects."""

    def __init__(self, collect_tp: int = 0):
        self.set_dispatch_mesh(
            "actor", dp_rank=self.rank // 2, dp_size=2, is_collect=self.rank % 2 == collect_tp
        )

    @register(Dispatch.mesh("actor"))
    def forward(self, data):
        return DataProto.from_dict(
            {"x": data.batch["x"], "rank": torch.full((len(data),), self.rank)},
        )


def test_mesh_dispatch_sends_one_chunk_per_dp_group_and_collects_collect_ranks():
    g = LocalWorkerGroup(ResourcePool([4]), ClassWithInitArgs(Meshy, collect_tp=1))
    out = g.forward(batch(5))  # padded to 6: dp 0 gets rows 0-2, dp 1 rows 3-5 (5 = pad of 0)
    assert out.batch["x"].tolist() == [0, 1, 2, 3, 4]
    assert out.batch["rank"].tolist() == [1, 1, 1, 3, 3]  # the tp=1 rank of each DP group


def test_mesh_declaration_errors():
    class Undeclared(Worker):
        def __init__(self):
            if self.rank != 2:
                self.set_dispatch_mesh("m", dp_rank=0, dp_size=1, is_collect=self.rank == 0)

        @register(Dispatch.mesh("m"))
        def f(self, data):
            return data

    g = LocalWorkerGroup(ResourcePool([3]), Undeclared)
    with pytest.raises(DispatchError, match=r"rank\(s\) \[2\] did not declare dispatch mesh 'm'"):
        g.f(batch(2))

    class TwoCollectors(Worker):
        def __init__(self):
            self.set_dispatch_mesh("m", dp_rank=0, dp_size=1, is_collect=True)

        @register(Dispatch.mesh("m"))
        def f(self, data):
            return data

    g = LocalWorkerGroup(ResourcePool([2]), TwoCollectors)
    with pytest.raises(DispatchError, match=r"dp_rank 0 has 2 collect ranks \[0, 1\]"):
        g.f(batch(2))
    w = Worker()
    with pytest.raises(ValueError, match=r"need 0 <= dp_rank < dp_size, got dp_rank=2, dp_size=2"):
        w.set_dispatch_mesh("m", dp_rank=2, dp_size=2)


def test_non_blocking_local_calls_chain():
    class Twice(Worker):
        @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
        def twice(self, data):
            return DataProto.from_dict({"x": data.batch["x"] * 2})

    g = LocalWorkerGroup(ResourcePool([2]), Twice)
    first = g.twice(batch(5))
    second = g.twice(first)
    assert second.done()
    assert second.result().batch["x"].tolist() == [0, 4, 8, 12, 16]


def test_world_size_one_sets_the_torch_distributed_environment(monkeypatch):
    import torch.distributed as dist

    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)

    class Dist(Worker):
        @register()
        def all_reduce(self, value):
            dist.init_process_group(backend=self.platform.dist_backend)
            try:
                t = torch.tensor([value])
                dist.all_reduce(t)
                return t.item(), dist.get_world_size()
            finally:
                dist.destroy_process_group()

    g = LocalWorkerGroup(ResourcePool([1]), Dist)
    assert os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] == "1"
    assert int(os.environ["MASTER_PORT"]) == g.worker_infos[0].master_port > 0
    assert g.all_reduce(5.0) == [(5.0, 1)]


def test_isolation_copies_arguments_and_results():
    class Mutate(Worker):
        @register(Dispatch.DP_COMPUTE_PROTO)
        def bump(self, data):
            data.batch["x"] += 1
            return data

    data = batch(4)
    out = LocalWorkerGroup(ResourcePool([2]), Mutate).bump(data)
    assert data.batch["x"].tolist() == [0, 1, 2, 3]  # the driver's batch is untouched
    assert out.batch["x"].tolist() == [1, 2, 3, 4]
    shared = LocalWorkerGroup(ResourcePool([2]), Mutate, isolate=False)
    shared.bump(data)
    assert data.batch["x"].tolist() == [1, 2, 3, 4]  # by reference, as documented


def test_worker_outside_a_group_reads_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    w = Echo()
    assert (w.rank, w.world_size, w.local_rank) == (3, 8, 1)
    assert isinstance(w.info, WorkerInfo) and w.platform.name == w.info.platform


def test_resource_pool_validation():
    with pytest.raises(ValueError, match=r"process_on_nodes\[1\] must be an int >= 1, got 0"):
        ResourcePool([2, 0])
    with pytest.raises(ValueError, match="non-empty list"):
        ResourcePool([])
    with pytest.raises(ValueError, match="use cpus_per_process"):
        ResourcePool([1], resources_per_process={"GPU": 1})
    assert ResourcePool([2, 3]).world_size == 5
    with pytest.raises(TypeError, match="subclass of rl_core Worker"):
        ClassWithInitArgs(dict)


def test_padding_rows_repeat_from_the_start_on_ranks():
    """With 3 ranks and 4 rows, the last rank computes on rows 0-1 again (dropped after)."""

    class Seen(Worker):
        @register(Dispatch.DP_COMPUTE_PROTO)
        def seen(self, data):
            return DataProto.from_dict(
                {"x": data.batch["x"]}, {"seen_by": np.full(len(data), self.rank)}
            )

        @register(Dispatch.ONE_TO_ALL)
        def nothing(self):
            return None

    g = LocalWorkerGroup(ResourcePool([3]), Seen)
    out = g.seen(batch(4))
    assert out.batch["x"].tolist() == [0, 1, 2, 3]
    assert out.non_tensor_batch["seen_by"].tolist() == [0, 0, 1, 1]


def test_import_rl_core_never_imports_ray_and_the_backend_names_the_extra():
    import subprocess
    import sys

    code = "import sys, rl_core, rl_core.single_controller; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    code = "import sys; sys.modules['ray'] = None; import rl_core.single_controller.ray"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0 and "pip install 'rl-core[ray]'" in out.stderr

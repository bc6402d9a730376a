"""RayWorkerGroup on an embedded Ray (4 logical CPUs; workers take 0.5 CPU each).

Every dispatch mode, padding, 2x2 mesh collect, futures chained worker to worker,
colocated roles, torch.distributed (gloo) inside a group, and the failure paths: a worker
that raises, one that dies, a hung call, an infeasible resource request. The last test
runs one algorithm unchanged on LocalWorkerGroup and RayWorkerGroup.
"""

from __future__ import annotations

import os
import sys
import time

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
    ResourcePoolError,
    Worker,
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
    create_colocated_worker_cls,
    register,
)

ray_only = pytest.mark.ray
HALF_CPU = {"cpus_per_process": 0.5}


@pytest.fixture(scope="module")
def ray_session():
    import ray

    saved = {k: os.environ.get(k) for k in ("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "RAY_AUTH_MODE")}
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"  # workers use this interpreter
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(num_cpus=4, include_dashboard=False)
    # pytest imports this file under a name workers cannot import: ship its classes by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    ray.shutdown()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def ray_group(*args, **kwargs):
    from rl_core.single_controller.ray import RayWorkerGroup

    return RayWorkerGroup(*args, **kwargs)


def batch(n: int, dtype=torch.float32) -> DataProto:
    return DataProto.from_dict(
        {"x": torch.arange(n, dtype=dtype)},
        {"uid": [f"u{i}" for i in range(n)]},
        {"temperature": 0.7},
    )


class Echo(Worker):
    def __init__(self, offset: int = 0):
        self.offset = offset
        self.calls = 0

    @register(Dispatch.ONE_TO_ALL)
    def placement(self):
        env = {
            k: os.environ[k]
            for k in (
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "LOCAL_WORLD_SIZE",
                "MASTER_ADDR",
                "MASTER_PORT",
            )
        }
        return {"pid": os.getpid(), "env": env, "info": self.info}

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
        return DataProto.from_dict(
            {"x": data.batch["x"].clone(), "rank": torch.full((len(data),), self.rank)},
            {"uid": data.non_tensor_batch["uid"]},
            dict(data.meta_info),
        )

    @register(Dispatch.DP_COMPUTE_PROTO, pad=False)
    def tag_rows_no_pad(self, data: DataProto) -> DataProto:
        self.calls += 1
        return DataProto.from_dict({"n": torch.full((len(data),), len(data))})

    @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def slow_double(self, data: DataProto) -> DataProto:
        time.sleep(float(data.meta_info.get("sleep", 0.0)))
        return DataProto.from_dict(
            {"x": data.batch["x"] * 2, "rank": torch.full((len(data),), self.rank)},
            {"uid": data.non_tensor_batch["uid"]},
            {"temperature": data.meta_info["temperature"]},
        )

    @register(Dispatch.ONE_TO_ALL)
    def identity(self, x):
        return x

    @register(Dispatch.ALL_TO_ALL, blocking=False)
    def per_rank_value(self, x):
        return x * 100 + self.rank

    @register()
    def call_count(self):
        return self.calls

    @register()
    def fail(self, message):
        if self.rank == 1:
            raise KeyError(message)
        return self.rank

    @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def fail_later(self, data):
        if self.rank == 1:
            raise RuntimeError("producer failed")
        return data

    @register()
    def exit_on_rank_one(self):
        if self.rank == 1:
            os._exit(3)
        time.sleep(0.5)
        return self.rank

    @register()
    def peer_error_before_death(self):
        """Rank 0 fails at once (like a collective broken by its peer); rank 1 dies later."""
        if self.rank == 0:
            raise ConnectionResetError("peer closed the connection")
        time.sleep(1.0)
        os._exit(3)

    @register(blocking=False)
    def sleep(self, seconds):
        time.sleep(seconds)
        return self.rank

    @register()
    def all_reduce(self):
        import datetime

        import torch.distributed as dist

        dist.init_process_group(self.platform.dist_backend, timeout=datetime.timedelta(seconds=60))
        try:
            value = torch.tensor([float(self.rank + 1), 10.0 * (self.rank + 1)])
            dist.all_reduce(value)
            gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
            dist.all_gather(gathered, torch.tensor([float(self.rank)]))
            dist.barrier()
            return value.tolist(), [g.item() for g in gathered], dist.get_backend()
        finally:
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def echo(ray_session):
    group = ray_group(
        ResourcePool([2], **HALF_CPU), ClassWithInitArgs(Echo, offset=100), name_prefix="echo"
    )
    yield group
    group.shutdown()


@ray_only
def test_placement_and_torch_distributed_environment(echo):
    placed = echo.placement()
    pids = {p["pid"] for p in placed}
    assert len(pids) == 2 and os.getpid() not in pids
    port = placed[0]["env"]["MASTER_PORT"]
    for rank, p in enumerate(placed):
        info = p["info"]
        assert p["env"] == {
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": info.node_ip,
            "MASTER_PORT": port,
        }
        assert info == echo.worker_infos[rank] and info.role == "echo"
        assert info.resources.num_cpus == 0.5 and info.resources.accelerator_ids == ()


@ray_only
def test_every_dispatch_mode(echo):
    before = echo.call_count()
    assert echo.one_to_all(1, y=2) == [(0, 103), (1, 103)]
    assert echo.rank_zero("z") == (0, "z")
    assert echo.only_rank_zero() == 0
    assert echo.all_to_all(["a", "b"], y=(1, 2)) == [(0, "a", 1), (1, "b", 2)]
    assert echo.dp_compute([[1], [2, 3]]) == [[10], [20, 30]]
    after = echo.call_count()
    assert [a - b for a, b in zip(after, before)] == [5, 3]  # rank 1: no rank-0-only calls


@ray_only
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_dp_compute_proto_padding_and_unpadding(echo, n):
    out = echo.tag_rows(batch(n))
    assert not out.is_readonly  # received mapped for the concatenation, which copied
    assert torch.equal(out.batch["x"], torch.arange(n, dtype=torch.float32))
    assert list(out.non_tensor_batch["uid"]) == [f"u{i}" for i in range(n)]
    assert out.meta_info == {"temperature": 0.7}
    k = -(-n // 2)
    assert out.batch["rank"].tolist() == [i // k for i in range(n)]
    if n >= 2:
        assert echo.tag_rows_no_pad(batch(n)).batch["n"].tolist() == [k] * k + [n - k] * (n - k)


@ray_only
def test_bad_arguments_fail_on_the_driver(echo):
    before = echo.call_count()
    with pytest.raises(DispatchError, match=r"one element per rank \(world_size=2\)"):
        echo.all_to_all([1, 2, 3], y=[1, 2])
    with pytest.raises(DispatchError, match=r"has 1 rows, fewer than the 2 data-parallel ranks"):
        echo.tag_rows_no_pad(batch(1))
    with pytest.raises(DispatchError, match="argument 0 is int"):
        echo.tag_rows(3)
    with pytest.raises(AttributeError, match="no method 'missing'"):
        echo.missing()
    assert echo.call_count() == before


class Meshy(Worker):
    """2 DP x 2 TP: rank = dp * 2 + tp; tp rank 1 holds the outputs."""

    def __init__(self):
        self.set_dispatch_mesh(
            "actor", dp_rank=self.rank // 2, dp_size=2, is_collect=self.rank % 2 == 1
        )

    @register(Dispatch.mesh("actor"))
    def forward(self, data):
        return DataProto.from_dict(
            {"x": data.batch["x"], "rank": torch.full((len(data),), self.rank)}
        )

    @register(Dispatch.mesh("actor"))
    def seen(self, data):
        return DataProto.from_dict(
            {"x": data.batch["x"], "rank": torch.full((len(data),), self.rank)}
        )

    @register(Dispatch.DP_COMPUTE_PROTO)
    def tag_rows(self, data):
        return DataProto.from_dict(
            {"x": data.batch["x"], "rank": torch.full((len(data),), self.rank)},
            {"uid": data.non_tensor_batch["uid"]},
        )


@pytest.fixture(scope="module")
def mesh(ray_session):
    group = ray_group(ResourcePool([4], **HALF_CPU), Meshy, name_prefix="mesh")
    yield group
    group.shutdown()


@ray_only
def test_mesh_dispatch_2x2(mesh):
    out = mesh.forward(batch(5))  # padded to 6: DP 0 <- rows 0-2, DP 1 <- rows 3,4,0
    assert out.batch["x"].tolist() == [0, 1, 2, 3, 4]
    assert out.batch["rank"].tolist() == [1, 1, 1, 3, 3]
    out = mesh.forward(batch(8))
    assert out.batch["rank"].tolist() == [1] * 4 + [3] * 4


@ray_only
def test_future_split_across_groups_of_different_size(echo, mesh):
    """A 2-rank producer's output re-split over 4 ranks (7 rows padded to 8) on the workers."""
    produced = echo.slow_double(batch(7))
    gather, produced._gather = produced._gather, None  # not materialised on the driver
    out = mesh.tag_rows(produced)
    produced._gather = gather
    expected = mesh.tag_rows(produced.result())  # the same call on the materialised batch
    assert out.batch["x"].tolist() == [2.0 * i for i in range(7)]
    assert out.batch["rank"].tolist() == expected.batch["rank"].tolist() == [0, 0, 1, 1, 2, 2, 3]
    assert list(out.non_tensor_batch["uid"]) == [f"u{i}" for i in range(7)]
    meshed = mesh.forward(echo.slow_double(batch(5)))  # and into the 2x2 mesh: DP size 2
    assert meshed.batch["x"].tolist() == [0, 2, 4, 6, 8] and meshed.batch["rank"].tolist() == [
        1,
        1,
        1,
        3,
        3,
    ]


@ray_only
def test_futures_chain_worker_to_worker(echo):
    data = batch(5, torch.float64)
    data.meta_info["sleep"] = 1.5
    start = time.monotonic()
    first = echo.slow_double(data)
    first._gather = None  # the driver must never materialise the intermediate result
    second = echo.slow_double(first)
    submitted = time.monotonic() - start
    assert submitted < 1.0, f"chaining waited for the first call ({submitted:.2f} s)"
    third = echo.tag_rows(second)  # blocking consumer of a future
    assert third.batch["x"].tolist() == [0, 4, 8, 12, 16]
    assert third.meta_info == {"temperature": 0.7}
    assert second.result().batch["x"].tolist() == [0, 4, 8, 12, 16]
    # ONE_TO_ALL receives the whole collected value, ALL_TO_ALL one element per rank
    assert echo.identity(echo.per_rank_value([1, 2])) == [[100, 201], [100, 201]]
    whole = echo.identity(echo.slow_double(batch(3)))
    assert [w.batch["x"].tolist() for w in whole] == [[0, 2, 4], [0, 2, 4]]
    per_rank = echo.per_rank_value([1, 2])
    assert echo.all_to_all(per_rank, y=["a", "b"]) == [(0, 100, "a"), (1, 201, "b")]
    with pytest.raises(DispatchError, match=r"is a future of echo\.slow_double"):
        echo.all_to_all(echo.slow_double(batch(2)), y=[1, 2])


@ray_only
def test_producer_error_surfaces_in_the_consumer_naming_the_producer(echo):
    failed = echo.fail_later(batch(4))
    with pytest.raises(WorkerError) as err:
        echo.tag_rows(failed)
    assert err.value.method == "fail_later" and err.value.rank == 1
    assert "producer failed" in str(err.value)


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


@ray_only
def test_colocated_roles_run_in_the_same_processes(ray_session):
    fused = ray_group(
        ResourcePool([2], **HALF_CPU), create_colocated_worker_cls({"actor": Actor, "ref": Ref})
    )
    try:
        groups = fused.spawn()
        actor, ref = groups["actor"], groups["ref"]
        pids = actor.pid()
        assert pids == ref.pid() and len(set(pids)) == 2
        actor.set_weight(3.0)
        assert actor.scale(batch(3)).batch["y"].tolist() == [0.0, 3.0, 6.0]
        assert ref.negate(batch(3)).batch["z"].tolist() == [0.0, -1.0, -2.0]
    finally:
        fused.shutdown()


@ray_only
def test_gloo_all_reduce_inside_the_group(echo):
    assert echo.all_reduce() == [([3.0, 30.0], [0.0, 1.0], "gloo")] * 2
    assert echo.all_reduce() == [([3.0, 30.0], [0.0, 1.0], "gloo")] * 2  # and again


@ray_only
def test_worker_that_raises_names_role_rank_node_and_traceback(echo):
    with pytest.raises(WorkerError) as err:
        echo.fail("no such key")
    e = err.value
    info = echo.worker_infos[1]
    assert (e.role, e.rank, e.method, e.exc_type) == ("echo", 1, "fail", "KeyError")
    assert (e.node_ip, e.node_id) == (info.node_ip, info.node_id)
    assert isinstance(e.original, KeyError)
    text = str(e)
    assert f"'echo' rank 1 on {info.node_ip}" in text and "no such key" in text
    assert "raise KeyError(message)" in text  # the remote traceback
    assert echo.one_to_all(0) == [(0, 100), (1, 100)]  # the group still works


@ray_only
def test_worker_that_dies_fails_the_call_within_the_timeout(ray_session):
    group = ray_group(ResourcePool([2], **HALF_CPU), Echo, name_prefix="mortal", call_timeout_s=60)
    try:
        start = time.monotonic()
        with pytest.raises(WorkerDiedError) as err:
            group.exit_on_rank_one()
        assert time.monotonic() - start < 30
        assert (err.value.role, err.value.rank, err.value.method) == (
            "mortal",
            1,
            "exit_on_rank_one",
        )
        assert "'mortal' rank 1" in str(err.value) and group.worker_infos[1].node_ip in str(
            err.value
        )
        import ray

        ray.kill(group.workers[0])
        # both ranks are dead now; which one is named first depends on when Ray notices
        with pytest.raises(WorkerDiedError, match=r"'mortal' rank [01] .*died during one_to_all"):
            group.one_to_all(1)
    finally:
        group.shutdown()


@ray_only
def test_a_death_reported_after_a_peer_error_is_still_named_first(ray_session):
    # the peer's error reaches the driver about a second before the death: the death wins
    group = ray_group(ResourcePool([2], **HALF_CPU), Echo, name_prefix="late", call_timeout_s=60)
    try:
        with pytest.raises(WorkerDiedError) as err:
            group.peer_error_before_death()
        assert (err.value.rank, err.value.method) == (1, "peer_error_before_death")
    finally:
        group.shutdown()


@ray_only
def test_hung_call_raises_timeout_naming_ranks(echo):
    start = time.monotonic()
    pending = echo.sleep(6)
    with pytest.raises(WorkerTimeoutError) as err:
        pending.result(timeout_s=2)
    assert 1.5 < time.monotonic() - start < 5.5
    assert err.value.ranks == [0, 1] and err.value.method == "sleep"
    assert "'echo' sleep() did not finish within 2 s on rank(s) [0, 1]" in str(err.value)
    assert pending.result(timeout_s=60) == [0, 1]  # it was slow, not dead


class BrokenInit(Worker):
    def __init__(self):
        if self.rank == 1:
            raise ValueError("cannot load model")


@ray_only
def test_failing_worker_init_names_the_rank(ray_session):
    with pytest.raises(
        WorkerError,
        match=r"'BrokenInit' rank 1 .*ValueError in BrokenInit.__init__\(\): cannot load model",
    ):
        ray_group(ResourcePool([2], **HALF_CPU), BrokenInit)


@ray_only
def test_infeasible_resource_pool_fails_clearly(ray_session):
    start = time.monotonic()
    pool = ResourcePool(
        [1], cpus_per_process=0.5, resources_per_process={"no_such_thing": 1}, placement_timeout_s=2
    )
    with pytest.raises(ResourcePoolError) as err:
        ray_group(pool, Echo)
    assert time.monotonic() - start < 15
    text = str(err.value)
    assert "within 2 s" in text and "'no_such_thing': 1.0" in text and "Cluster total" in text


# ------------------------------------------------------------------------------ algorithm


class Policy(Worker):
    """Linear scorer: score = x @ w. The driver runs the optimiser."""

    def __init__(self, dim: int):
        self.w = torch.linspace(-1, 1, dim, dtype=torch.float64)

    @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def score(self, data):
        return DataProto.from_dict({"score": data.batch["x"] @ self.w})

    @register(Dispatch.DP_COMPUTE_PROTO)
    def grad(self, data):
        # d/dw of sum_i adv_i * score_i, one row per sample (the driver sums them)
        return DataProto.from_dict({"g": data.batch["adv"][:, None] * data.batch["x"]})

    @register()
    def set_weights(self, w):
        self.w = w.clone()

    @register(Dispatch.RANK_ZERO)
    def weights(self):
        return self.w


class Reference(Worker):
    def __init__(self, dim: int):
        self.w = torch.linspace(-1, 1, dim, dtype=torch.float64)

    @register(Dispatch.DP_COMPUTE_PROTO)
    def score(self, data):
        return DataProto.from_dict({"ref_score": data.batch["x"] @ self.w})


def run_algorithm(make_group, steps: int = 3, n: int = 7, dim: int = 4) -> torch.Tensor:
    """A tiny policy-gradient loop written once against the WorkerGroup API."""
    fused = make_group(
        ResourcePool([2], **HALF_CPU),
        create_colocated_worker_cls(
            {"policy": ClassWithInitArgs(Policy, dim), "ref": ClassWithInitArgs(Reference, dim)}
        ),
    )
    try:
        roles = fused.spawn()
        policy, ref = roles["policy"], roles["ref"]
        g = torch.Generator().manual_seed(0)
        x = torch.randn(n, dim, generator=g, dtype=torch.float64)
        reward = torch.randn(n, generator=g, dtype=torch.float64)
        data = DataProto.from_dict({"x": x})
        w = policy.weights()
        for _ in range(steps):
            scores = policy.score(data)  # future
            ref_scores = ref.score(data).batch["ref_score"]
            s = scores.result().batch["score"]
            adv = reward - reward.mean() - 0.1 * (s - ref_scores)
            grads = policy.grad(data.union(DataProto.from_dict({"adv": adv})))
            w = w + 0.05 * grads.batch["g"].sum(0)
            policy.set_weights(w)
        return policy.weights()
    finally:
        fused.shutdown()


def reference_algorithm(steps: int = 3, n: int = 7, dim: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, dim, generator=g, dtype=torch.float64)
    reward = torch.randn(n, generator=g, dtype=torch.float64)
    w0 = torch.linspace(-1, 1, dim, dtype=torch.float64)
    w = w0.clone()
    for _ in range(steps):
        adv = reward - reward.mean() - 0.1 * (x @ w - x @ w0)
        w = w + 0.05 * (adv[:, None] * x).sum(0)
    return w


@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_same_algorithm_on_local_and_ray(backend, request):
    if backend == "ray":
        request.getfixturevalue("ray_session")
        make_group = ray_group
    else:
        make_group = LocalWorkerGroup
    w = run_algorithm(make_group)
    expected = reference_algorithm()
    assert not torch.equal(expected, torch.linspace(-1, 1, 4, dtype=torch.float64))
    torch.testing.assert_close(w, expected, rtol=1e-12, atol=1e-12)
    assert np.isfinite(w.numpy()).all()

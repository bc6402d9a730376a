"""What the single controller adds on top of raw Ray, measured in the same run.

* worker-group creation (2 workers: placement group, actors, rank-0 port, worker __init__)
  vs starting 2 plain Ray actors that import the same libraries;
* latency of a no-op method on 2 workers vs ``ray.get`` of 2 raw actor calls;
* DP dispatch + collect of a 64 MiB and a 512 MiB DataProto (one float32 tensor) across 2
  workers whose method returns its chunk: ``group.echo(batch)`` (pad, chunk, send, run,
  fetch, concatenate, unpad) against raw Ray moving the same bytes:

  - *actor echo + concat* (the same job): ``ray.get`` of two raw actor calls that return
    their chunk, then ``DataProto.concat`` to get one batch back, as the framework does;
  - *actor echo only*: the transport alone (``ray.put`` of the arguments, the actors'
    receive and return, the driver's ``ray.get``), no concatenation;
  - *driver put+get once*: ``ray.put`` + ``ray.get`` of the chunks in the driver (the bytes
    cross the object store once, not there and back: a lower bound).

  The target (the framework adds under 20% to raw Ray) applies to the same job. Each
  comparison is timed interleaved (raw, framework, raw, ...) so both see the same machine
  load. Rows with ``zero_copy_receive=True`` let receivers map the object store instead
  of copying.

    flock /tmp/rl-heavy.lock uv run python benchmarks/controller.py [--repeats 7] [--sizes-mib 64 512]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # use this interpreter for workers
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray
import torch

from rl_core import DataProto
from rl_core.single_controller import Dispatch, ResourcePool, Worker, register
from rl_core.single_controller.ray import RayWorkerGroup

MiB = 2**20


class Bench(Worker):
    @register()
    def noop(self):
        return None

    @register(Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return data


@ray.remote(num_cpus=1)
class RawEcho:
    def __init__(self):
        import rl_core  # noqa: F401  (the same imports as a framework worker)

    def noop(self):
        return None

    def echo(self, value):
        return value


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            gc.collect()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def creation(repeats: int) -> tuple[float, float]:
    group_times, raw_times = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        group = RayWorkerGroup(ResourcePool([2], cpus_per_process=1), Bench)
        group.noop()
        group_times.append(time.perf_counter() - start)
        group.shutdown()
        start = time.perf_counter()
        actors = [RawEcho.remote() for _ in range(2)]
        ray.get([a.noop.remote() for a in actors])
        raw_times.append(time.perf_counter() - start)
        for a in actors:
            ray.kill(a)
        time.sleep(1.0)
    return statistics.median(group_times), statistics.median(raw_times)


def make_batch(size_mib: int, zero_copy: bool) -> DataProto:
    rows = 1024
    cols = size_mib * MiB // 4 // rows
    data = DataProto.from_dict({"x": torch.rand(rows, cols)})
    data.zero_copy_receive = zero_copy
    return data


def throughput(
    group: RayWorkerGroup, actors: list, size: int, zero_copy: bool, repeats: int
) -> list[str]:
    """DP dispatch + collect of `size` MiB through the group vs the same bytes through raw Ray."""
    data = make_batch(size, zero_copy)
    chunks = data.chunk(2)
    out = group.echo(data)
    assert torch.equal(out.batch["x"], data.batch["x"]), "echo changed the data"
    assert not out.is_readonly or zero_copy, "the collected batch must be private memory"
    del out

    def put_get():
        return ray.get([ray.put(c) for c in chunks])

    def raw_actor():
        return ray.get([a.echo.remote(c) for a, c in zip(actors, chunks)])

    times = interleaved(
        {
            "put_get": put_get,
            "raw_actor": raw_actor,
            "raw_actor_concat": lambda: DataProto.concat(raw_actor()),
            "framework": lambda: group.echo(data),
        },
        repeats,
    )
    med = {name: statistics.median(t) for name, t in times.items()}
    fw = med["framework"]

    def cell(name: str) -> str:
        return f"{med[name] * 1e3:.0f} ms ({fw / med[name]:.2f}x)"

    return [
        f"{size} MiB{', zero-copy receive' if zero_copy else ''}",
        f"{fw * 1e3:.0f} ms ({size / 1024 / fw:.2f} GiB/s)",
        cell("raw_actor_concat"),
        cell("raw_actor"),
        cell("put_get"),
    ]


def table(header: tuple[str, ...], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(header, widths)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[64, 512])
    args = parser.parse_args()

    ray.init(address="local", num_cpus=4, include_dashboard=False)
    calls: list[list[str]] = []

    group_s, raw_s = creation(max(1, args.repeats // 2))
    calls.append(
        [
            "create 2 workers + first call",
            f"{group_s:.2f} s",
            f"{raw_s:.2f} s",
            f"{group_s / raw_s:.2f}",
        ]
    )

    group = RayWorkerGroup(ResourcePool([2], cpus_per_process=1), Bench)
    actors = [RawEcho.remote() for _ in range(2)]
    ray.get([a.noop.remote() for a in actors])
    for _ in range(20):  # warm up both paths
        group.noop()
        ray.get([a.noop.remote() for a in actors])

    lat = interleaved(
        {
            "raw": lambda: ray.get([a.noop.remote() for a in actors]),
            "group": group.noop,
        },
        args.calls,
    )
    group_ms, raw_ms = median_ms(lat["group"]), median_ms(lat["raw"])
    calls.append(
        [
            f"no-op call on 2 workers (median of {args.calls})",
            f"{group_ms:.2f} ms",
            f"{raw_ms:.2f} ms",
            f"{group_ms / raw_ms:.2f}",
        ]
    )

    moves: list[list[str]] = []
    for size in args.sizes_mib:
        for zero_copy in (False, True):
            moves.append(throughput(group, actors, size, zero_copy, args.repeats))
            gc.collect()

    group.shutdown()
    ray.shutdown()
    print(table(("measurement", "framework", "raw Ray", "ratio"), calls))
    print()
    print(
        table(
            (
                "DP dispatch + collect, 2 workers",
                "framework group.echo",
                "raw: actor echo + concat (same job)",
                "raw: actor echo only",
                "raw: driver put+get once",
            ),
            moves,
        )
    )
    print(f"\nmedian of {args.repeats} interleaved repeats; (Nx) = framework time / that time")


if __name__ == "__main__":
    main()

"""Per-call overhead and worker start time of rl-algos' ScoringPool, beside pebble's
ProcessPool (the maintained candidate to replace it; see rl_algos/rewards/pool.py).

Each pool runs ``--calls`` calls of a trivial function (``dict(x=i)``: importable anywhere)
on ``--workers`` processes, with a per-call time limit (pebble: ``schedule(timeout=)``).
Per-call overhead = wall time / calls, best of 3 batches. Worker start = the first batch of one call on a
fresh pool. pebble is measured only where it is importable (``pip install pebble``); its
``spawn`` and ``forkserver`` contexts are the safe ones in a driver with threads (Ray,
torch), and both import the parent's ``__main__`` in the workers. Run it alone::

    uv run python benchmarks/reward_pool.py [--calls 2000] [--workers 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

from rl_algos.rewards.pool import ScoringPool

REPEATS = 3  # per-call overhead: the best of 3 batches (a shared machine is noisy)


def scoring_pool(calls: int, workers: int) -> tuple[float, float]:
    with ScoringPool(workers, timeout_s=10) as pool:
        start = time.perf_counter()
        assert pool.run([(dict, {"x": 0})])[0].value == {"x": 0}
        startup = time.perf_counter() - start
        batch = [(dict, {"x": i}) for i in range(calls)]
        best = float("inf")
        for _ in range(REPEATS):
            start = time.perf_counter()
            results = pool.run(batch)
            best = min(best, time.perf_counter() - start)
            assert [r.value["x"] for r in results] == list(range(calls))
    return startup, best / calls


def pebble_pool(calls: int, workers: int, method: str) -> tuple[float, float]:
    import pebble

    context = multiprocessing.get_context(method)
    with pebble.ProcessPool(max_workers=workers, context=context) as pool:
        start = time.perf_counter()
        assert pool.schedule(dict, kwargs={"x": 0}, timeout=10).result() == {"x": 0}
        startup = time.perf_counter() - start
        best = float("inf")
        for _ in range(REPEATS):
            start = time.perf_counter()
            futures = [pool.schedule(dict, kwargs={"x": i}, timeout=10) for i in range(calls)]
            values = [f.result()["x"] for f in futures]
            best = min(best, time.perf_counter() - start)
            assert values == list(range(calls))
    return startup, best / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    rows = [("rl_algos ScoringPool", scoring_pool(args.calls, args.workers))]
    try:
        import pebble  # noqa: F401

        for method in ("spawn", "forkserver"):
            rows.append(
                (f"pebble ProcessPool ({method})", pebble_pool(args.calls, args.workers, method))
            )
    except ImportError:
        print("pebble is not installed: measured ScoringPool only")
    print(f"| pool | first call (worker start) | per-call overhead ({args.calls} calls) |")
    print("| --- | --- | --- |")
    for name, (startup, per_call) in rows:
        print(f"| {name} | {startup * 1e3:.0f} ms | {per_call * 1e6:.0f} us |")


if __name__ == "__main__":
    main()

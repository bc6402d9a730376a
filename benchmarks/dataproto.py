"""DataProto operations on an RL-sized batch, against the raw memory-copy cost.

Batch: 1024 rows x 2048 tokens of int64 input_ids, attention_mask, position_ids and float32
old_log_probs (56 MiB of tensors) plus two object arrays of 1024 strings. For every
operation the table gives the median time, the bytes it actually wrote into new memory
(measured: output tensors that share no storage with the input), the bytes it must move at
the least, the time of a plain `torch.clone` of that many bytes (timed interleaved with the
operation, so both see the same machine load), and
the ratio of the two.

    uv run python benchmarks/dataproto.py [--repeats 7] [--no-ray]
"""

from __future__ import annotations

import argparse
import gc
import os
import pickle
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # use this interpreter for workers
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import torch

from rl_core import DataProto

ROWS, TOKENS = 1024, 2048
MiB = 2**20


@dataclass
class Row:
    op: str
    seconds: float
    copied: int | None  # bytes written into new memory, None when it cannot tell
    required: int  # bytes the operation must move at the least
    raw_seconds: float | None  # torch.clone of those bytes, timed alongside the op


class Timer:
    """Times an operation and, interleaved with it, a raw copy of the bytes it must move.

    The raw copy clones buffers of the same sizes as the tensors the operation must write
    (so both pay the same allocation costs), and interleaving keeps the two comparable on a
    machine whose load changes during the run.
    """

    def __init__(self, repeats: int) -> None:
        self.repeats = repeats
        self.sources: dict[int, torch.Tensor] = {}
        self.rows: list[Row] = []

    def raw_copy(self, sizes: list[int]) -> Callable[[], object]:
        """torch.clone of one buffer per size (the same allocation pattern as the op)."""
        for n in sizes:
            if n not in self.sources:
                self.sources[n] = torch.ones(n, dtype=torch.uint8)
        sources = [self.sources[n] for n in sizes]
        return lambda: [src.clone() for src in sources]

    def run(self, op: str, fn: Callable[[], object], sizes: list[int]) -> object:
        """Time `fn`; `sizes` are the byte sizes of the tensors it must write at the least."""
        raw_copy = self.raw_copy(sizes) if sizes else None
        if raw_copy is not None:
            raw_copy()
        result = fn()  # warm-up
        times, raw_times = [], []
        for i in range(self.repeats):
            result = None
            if raw_copy is not None and i % 2:  # alternate the order: no ordering bias
                raw_times.append(self.time_once(raw_copy))
            gc.collect()
            start = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - start)
            if raw_copy is not None and not i % 2:
                raw_times.append(self.time_once(raw_copy))
        raw = statistics.median(raw_times) if raw_times else None
        self.rows.append(Row(op, statistics.median(times), None, sum(sizes), raw))
        return result

    @staticmethod
    def time_once(fn: Callable[[], object]) -> float:
        gc.collect()
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def copied(self, nbytes: int | None) -> None:
        """Record the bytes the last operation wrote into new memory."""
        self.rows[-1].copied = nbytes


def make_inputs() -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(ROWS, TOKENS, dtype=torch.int64)
    mask[:, : TOKENS // 4] = (torch.rand(ROWS, TOKENS // 4, generator=g) > 0.5).long()
    tensors = {
        "input_ids": torch.randint(0, 32000, (ROWS, TOKENS), generator=g),
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "old_log_probs": torch.randn(ROWS, TOKENS, generator=g),
    }
    non_tensors = {
        "uid": [f"uid-{i:06d}" for i in range(ROWS)],
        "data_source": [f"source-{i % 7}/prompt-{i}" for i in range(ROWS)],
    }
    return tensors, non_tensors


def leaves(dps: DataProto | Iterable[DataProto]) -> list[torch.Tensor]:
    dps = [dps] if isinstance(dps, DataProto) else list(dps)
    return [t for dp in dps if dp.batch is not None for t in dp.batch.values(True, True)]


def tensor_bytes(dps) -> int:
    return sum(t.numel() * t.element_size() for t in leaves(dps))


def new_bytes(outputs, inputs) -> int:
    """Bytes of output tensors whose storage is not one of the inputs' storages."""
    known = {t.untyped_storage().data_ptr() for t in leaves(inputs)}
    return sum(
        t.numel() * t.element_size()
        for t in leaves(outputs)
        if t.untyped_storage().data_ptr() not in known
    )


def in_process_ops(timer: Timer, dp: DataProto, tensors: dict, non_tensors: dict) -> None:
    sizes = [t.numel() * t.element_size() for t in leaves(dp)]  # each tensor field

    out = timer.run(
        "construction (from_dict)", lambda: DataProto.from_dict(tensors, non_tensors), []
    )
    timer.copied(new_bytes(out, dp))

    parts = timer.run("chunk(8)", lambda: dp.chunk(8), [])
    timer.copied(new_bytes(parts, dp))

    out = timer.run("concat of 8 chunks", lambda: DataProto.concat(parts), sizes)
    timer.copied(new_bytes(out, dp))

    left = dp.select(batch_keys=["input_ids", "attention_mask"], non_tensor_batch_keys=["uid"])
    right = dp.select(batch_keys=["position_ids", "old_log_probs", "attention_mask"])
    out = timer.run("union (shared field: same tensor)", lambda: left.union(right), [])
    timer.copied(new_bytes(out, dp))

    right_copy = right.select()
    right_copy.batch["attention_mask"] = right.batch["attention_mask"].clone()
    out = timer.run(
        "union (shared field: equal copy, compared)",
        lambda: left.union(right_copy),
        [tensors["attention_mask"].nbytes],  # reads 2 x 16 MiB, as much traffic as one copy
    )
    timer.copied(new_bytes(out, [dp, right_copy]))

    keys = {"batch_keys": ["input_ids", "attention_mask"], "non_tensor_batch_keys": ["uid"]}
    out = timer.run("select", lambda: dp.select(**keys), [])
    timer.copied(new_bytes(out, dp))

    def pop():
        scratch = dp.select()
        return scratch.pop(batch_keys=["old_log_probs"], non_tensor_batch_keys=["uid"])

    out = timer.run("pop", pop, [])
    timer.copied(new_bytes(out, dp))

    out = timer.run(
        "repeat(8, interleave=True)", lambda: dp.repeat(8, interleave=True), [8 * n for n in sizes]
    )
    timer.copied(new_bytes(out, dp))
    del out

    perm = torch.randperm(ROWS, generator=torch.Generator().manual_seed(1))
    out = timer.run("reorder (permutation)", lambda: dp.select().reorder(perm), sizes)
    timer.copied(new_bytes(out, dp))

    padded = [n // ROWS * (ROWS + (-ROWS % 7)) for n in sizes]
    out = timer.run("pad_to_divisor(7)", lambda: dp.pad_to_divisor(7)[0], padded)
    timer.copied(new_bytes(out, dp))

    def pickle_out_of_band():
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(dp, protocol=5, buffer_callback=buffers.append)
        return data, pickle.loads(data, buffers=buffers)

    data, out = timer.run("pickle round trip (protocol 5, out-of-band)", pickle_out_of_band, [])
    timer.copied(len(data) + new_bytes(out, dp))

    def pickle_in_band():
        data = pickle.dumps(dp, protocol=5)
        return data, pickle.loads(data)

    data, out = timer.run("pickle round trip (protocol 5, in-band)", pickle_in_band, 2 * sizes)
    timer.copied(len(data) + new_bytes(out, dp))


def ray_ops(timer: Timer, dp: DataProto, tensors: dict) -> None:
    import ray

    # "local": a fresh instance even when another Ray instance runs on this machine
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    sizes = [t.numel() * t.element_size() for t in leaves(dp)]  # each tensor field
    buffers: list[pickle.PickleBuffer] = []
    in_band = len(pickle.dumps(dp, protocol=5, buffer_callback=buffers.append))
    stored = in_band + sum(b.raw().nbytes for b in buffers)  # what ray.put writes

    def round_trip(obj):
        return lambda: ray.get(ray.put(obj), timeout=120)

    out = timer.run(
        "ray.put + ray.get (default: copied out of the store)", round_trip(dp), 2 * sizes
    )
    timer.copied(stored + sum(t.numel() * t.element_size() for t in leaves(out)))

    zero_copy = dp.select()
    zero_copy.zero_copy_receive = True
    out = timer.run(
        "ray.put + ray.get (zero_copy_receive: read-only)", round_trip(zero_copy), sizes
    )
    assert out.is_readonly
    timer.copied(stored)
    del out

    timer.run("reference: dict of the raw tensors through Ray", round_trip(tensors), 2 * sizes)
    ray.shutdown()


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / MiB:.1f} MiB" if n >= MiB / 10 else f"{n / 1024:.1f} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray rows")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    tensors, non_tensors = make_inputs()
    dp = DataProto.from_dict(tensors, non_tensors, {"temperature": 1.0})
    timer = Timer(args.repeats)
    in_process_ops(timer, dp, tensors, non_tensors)
    if not args.no_ray:
        ray_ops(timer, dp, tensors)

    print(
        f"DataProto benchmark: {ROWS} x {TOKENS}, {tensor_bytes(dp) / MiB:.0f} MiB of tensors, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"median of {args.repeats}\n"
    )
    print("| operation | median | bytes copied | must move | raw copy of that | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in timer.rows:
        raw = f"{row.raw_seconds * 1e3:.1f} ms" if row.raw_seconds else "-"
        ratio = f"{row.seconds / row.raw_seconds:.2f}x" if row.raw_seconds else "-"
        must = fmt_bytes(row.required) if row.required else "0"
        print(
            f"| {row.op} | {row.seconds * 1e3:.2f} ms | {fmt_bytes(row.copied)} | {must} | "
            f"{raw} | {ratio} |"
        )


if __name__ == "__main__":
    main()

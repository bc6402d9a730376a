"""Rank side of the attention-memory test: `benchmarks/attention_memory.py`'s measurements
on a narrow model (loaded from the repository, the benchmark is not a package)."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

BENCHMARK = os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "benchmarks", "attention_memory.py"
)
WIDTHS = {
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 256,
}


def _benchmark() -> Any:
    spec = importlib.util.spec_from_file_location("attention_memory", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(seqs: list[int], check_seq: int) -> dict[str, Any]:
    """Peak tensor MB of a forward and backward at each of ``seqs`` (sdpa), and the
    [S, S]-like tensors each attention creates at ``check_seq``."""
    bench = _benchmark()
    model = bench.build_model(WIDTHS, 2, 256)
    bench.forward_backward(model, 32, "sdpa")  # warm-up
    peaks = {s: bench.forward_backward(model, s, "sdpa")["tensor_mb"] for s in seqs}
    square = {a: bench.square_tensors(model, check_seq, a) for a in ("sdpa", "local")}
    return {"peaks": peaks, "square": square}

"""Rank side of the memory-model test: one training step of a tiny model with every
tensor counted (`benchmarks/memory_model.py`'s `counted_bytes` and `SavedActivations`,
loaded from the repository: the benchmark is not a package)."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from rl_core.engine import build_engine
from rl_core.testing.train_engine import engine_config, make_rl_batch, pg_loss

BENCHMARK = os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "benchmarks", "memory_model.py"
)
OPTIM = {"lr": 1e-3, "weight_decay": 0.0, "grad_clip": 1.0}


def memory_model() -> Any:
    """`benchmarks/memory_model.py` as a module (registered: its dataclasses need that)."""
    if "memory_model" in sys.modules:
        return sys.modules["memory_model"]
    spec = importlib.util.spec_from_file_location("memory_model", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules["memory_model"] = module
    spec.loader.exec_module(module)
    return module


def measure(engine_name: str, model_dir: str, options: dict[str, Any], seq: int, rows: int):
    """One step on ``rows`` full sequences of ``seq`` tokens per data-parallel rank (one
    micro-batch, half of each sequence response): the bytes of parameters, gradients,
    main parameters and moments counted from the tensors, and of the tensors saved for
    backward when the forward ended."""
    mm = memory_model()
    options = {**options, "micro_batch": {"micro_batch_size": rows}}
    engine = build_engine(engine_name, engine_config(model_dir, options, optim=OPTIM))
    grads = mm.capture_grads(engine)
    batch = make_rl_batch(
        num_seqs=rows * engine.dp_size, prompt_len=seq // 2, response_len=seq // 2
    )
    batch.batch["attention_mask"][:] = 1
    batch.batch["response_mask"][:] = 1
    local = batch.chunk(engine.dp_size)[engine.dp_rank]
    tensors = mm.engine_tensors(engine)
    saved: list[int] = []
    with mm.SavedActivations(tensors["model"]) as acts:

        def loss_fn(outputs, micro_batch, ctx):
            # FSDP2's unsharded parameters (the root's, or all of them on one rank) are
            # parameters, not activations
            model = engine.chunks if hasattr(engine, "chunks") else [engine.model]
            acts.exclude([p for m in model for p in m.parameters()])
            saved.append(acts.bytes_now())
            return pg_loss(outputs, micro_batch, ctx)

        metrics = engine.train_batch(local, loss_fn)
    counted = mm.counted_bytes(engine, grads)
    engine.close()
    return {"counted": counted, "activations": saved[0] if saved else None, "metrics": metrics}

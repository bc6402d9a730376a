"""Rank-side functions for the distributed-optimizer tests (`DistributedAdamW`): a few
training steps with the weights after each, checkpoints saved after the first step, and
seeded faults (a gradient reduced wrongly, a shard dropped) that the tests must catch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from rl_core.engine import build_engine
from rl_core.testing.train_engine import engine_config, make_rl_batch, pg_loss
from rl_engines.megatron import distributed_optimizer as do

# clipping on (the tiny models' gradient norms are ~2), a large eps keeps AdamW's update
# close to linear in the gradient so float32 summation order stays far below 1e-6
OPTIM = {"lr": 1e-2, "weight_decay": 0.01, "grad_clip": 0.5, "eps": 1e-3}
BATCH = 8


@contextlib.contextmanager
def seeded_fault(name: str | None) -> Iterator[None]:
    """Patch `DistributedAdamW` with one known defect for the duration of the block."""
    cls = do.DistributedAdamW
    saved = {
        k: getattr(cls, k) for k in ("reduce_scatter_grads", "publish", "load_full", "full_flat")
    }

    def unreduced(self):  # each rank steps its own, unreduced gradients
        for part in self.partitions:
            part.main.grad = part.grad_buffer[part.lo : part.hi]

    def mean(self):  # averaged instead of summed (the loss contract sums)
        saved["reduce_scatter_grads"](self)
        for part in self.partitions:
            part.main.grad.div_(part.size)

    def no_gather(self):  # the updated ranges of the other ranks never arrive
        for part in self.partitions:
            if not part.main_is_view:
                part.param_buffer[part.lo : part.hi].copy_(part.main)

    def load_drops_last_range(self, param, key, value):  # the last rank keeps stale state
        part, _ = self._where[id(param)]
        if part.rank != part.size - 1 or part.size == 1:
            saved["load_full"](self, param, key, value)

    def save_drops_a_range(self, param, key, dst=None):  # rank 1's range never written
        part, index = self._where[id(param)]
        if part.rank == 1 and key != "param" and index in part.overlap_of:
            a, b = part.overlap_of[index]
            state = self.state[part.main][key]
            kept = state[a - part.lo : b - part.lo].clone()
            state[a - part.lo : b - part.lo].zero_()
            try:
                return saved["full_flat"](self, param, key, dst)
            finally:
                state[a - part.lo : b - part.lo].copy_(kept)
        return saved["full_flat"](self, param, key, dst)

    patches = {
        None: {},
        "unreduced": {"reduce_scatter_grads": unreduced},
        "mean": {"reduce_scatter_grads": mean},
        "no-gather": {"publish": no_gather},
        "load-drops-range": {"load_full": load_drops_last_range},
        "save-drops-range": {"full_flat": save_drops_a_range},
    }[name]
    for key, fn in patches.items():
        setattr(cls, key, fn)
    try:
        yield
    finally:
        for key, fn in saved.items():
            setattr(cls, key, fn)


def train(
    model_dir: str,
    options: dict[str, Any],
    steps: int,
    fault: str | None = None,
    save_to: str | None = None,
    load_from: str | None = None,
    first_batch: int = 0,
) -> dict[str, Any]:
    """Build (and load ``load_from``), then ``steps`` steps on batches ``first_batch``,
    ... (each rank its data-parallel share of the same 8 sequences), saving after the
    first step to ``save_to``; the metrics and the exported weights after every step."""
    with seeded_fault(fault):
        engine = build_engine("megatron", engine_config(model_dir, options, optim=OPTIM))
        try:
            if load_from is not None:
                engine.load(load_from)
            metrics, weights = [], []
            for step in range(steps):
                batch = make_rl_batch(num_seqs=BATCH, seed=first_batch + step)
                local = batch.chunk(engine.dp_size)[engine.dp_rank]
                metrics.append(engine.train_batch(local, pg_loss))
                weights.append({n: t.clone() for b in engine.export_weights() for n, t in b})
                if step == 0 and save_to is not None:
                    engine.save(save_to)
            sharded = isinstance(engine.optimizer, do.DistributedAdamW)
            return {"metrics": metrics, "weights": weights, "sharded": sharded}
        finally:
            engine.close()


def build_and_load(model_dir: str, options: dict[str, Any], path: str) -> str | None:
    """The error text of loading ``path`` into an engine of ``options`` (None: it loaded)."""
    engine = build_engine("megatron", engine_config(model_dir, options, optim=OPTIM))
    try:
        engine.load(path)
    except Exception as exc:
        return str(exc)
    finally:
        engine.close()
    return None


def assert_same_run(got: dict[str, Any], want: dict[str, Any], what: str, atol: float) -> None:
    """Equal metrics (loss, grad norm) and exported weights after every step, to ``atol``."""
    assert len(got["weights"]) == len(want["weights"]), what
    for step, (g, w) in enumerate(zip(got["metrics"], want["metrics"])):
        for key in ("loss", "grad_norm"):
            assert abs(g[key] - w[key]) <= atol * max(1.0, abs(w[key])), (
                f"{what}, step {step}: {key} {g[key]} != {w[key]}"
            )
    for step, (g, w) in enumerate(zip(got["weights"], want["weights"])):
        assert g.keys() == w.keys(), what
        for name, tensor in w.items():
            err = float((g[name].float() - tensor.float()).abs().max())
            assert err <= atol, f"{what}, step {step}: {name} differs by {err:.3g} (> {atol})"


def max_error(got: dict[str, Any], want: dict[str, Any]) -> float:
    return max(
        float((g[n].float() - t.float()).abs().max())
        for g, w in zip(got["weights"], want["weights"])
        for n, t in w.items()
    )


def clipped(run: dict[str, Any]) -> bool:
    """Whether clipping was active at every step (norm above ``OPTIM['grad_clip']``)."""
    return all(m["grad_norm"] > OPTIM["grad_clip"] for m in run["metrics"])

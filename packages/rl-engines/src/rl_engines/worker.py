"""`EngineWorker`: one rank of a worker group that hosts a `TrainEngine`.

The controller drives training through the worker group::

    group = RayWorkerGroup(ResourcePool([2]), ClassWithInitArgs(
        EngineWorker, engine="fsdp", config=cfg, loss_fn=my_loss))
    group.init_engine()
    metrics = group.train_batch(batch).meta_info["metrics"]      # one optimizer step
    log_probs = group.infer_batch(batch).batch["log_probs"]       # no-grad forward

`train_batch` and `infer_batch` use ``Dispatch.mesh("dp")``: each data-parallel rank gets
its chunk and only collect ranks' outputs come back. Training chunks are never padded
(duplicated rows would change the gradient), so any batch with at least ``dp_size`` rows
works. Per-call options travel in ``batch.meta_info``: ``temperature``, ``outputs``
(e.g. ``["log_probs", "entropy"]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rl_core.engine import EngineConfig, LossFn, TrainEngine, build_engine
from rl_core.protocol import DataProto
from rl_core.single_controller import Dispatch, Worker, register

__all__ = ["DP_MESH", "EngineWorker"]

DP_MESH = "dp"


class EngineWorker(Worker):
    """Hosts the engine registered as ``engine`` built from ``config`` on this rank.

    ``loss_fn`` (picklable, e.g. a module-level function or a functools.partial) is what
    `train_batch` optimises; `set_loss_fn` replaces it.
    """

    def __init__(
        self,
        engine: str,
        config: EngineConfig | dict[str, Any],
        loss_fn: LossFn | None = None,
    ) -> None:
        self.engine_name = engine
        self.engine_config = (
            config if isinstance(config, EngineConfig) else EngineConfig.from_dict(config)
        )
        self.loss_fn = loss_fn
        self._engine: TrainEngine | None = None

    @property
    def engine(self) -> TrainEngine:
        if self._engine is None:
            raise RuntimeError(
                f"{self.info.role} rank {self.rank}: the engine is not built: call init_engine()"
            )
        return self._engine

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_engine(self) -> dict[str, Any]:
        """Build the engine (collective) and declare the ``dp`` dispatch mesh."""
        self._engine = build_engine(self.engine_name, self.engine_config)
        engine = self._engine
        self.set_dispatch_mesh(
            DP_MESH,
            dp_rank=engine.dp_rank,
            dp_size=engine.dp_size,
            is_collect=engine.is_collect_rank,
        )
        return {"dp_rank": engine.dp_rank, "dp_size": engine.dp_size, "step": engine.global_step}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_loss_fn(self, loss_fn: LossFn) -> None:
        self.loss_fn = loss_fn

    @register(dispatch_mode=Dispatch.mesh(DP_MESH), pad=False)
    def train_batch(self, batch: DataProto) -> DataProto:
        """One optimizer step; returns no rows and ``meta_info["metrics"]``."""
        if self.loss_fn is None:
            raise RuntimeError(
                f"{self.info.role} rank {self.rank}: no loss function: pass loss_fn to "
                "EngineWorker or call set_loss_fn first"
            )
        outputs = batch.meta_info.get("outputs")
        metrics = self.engine.train_batch(batch, self.loss_fn, outputs=outputs)
        return DataProto(meta_info={"metrics": metrics, "step": self.engine.global_step})

    @register(dispatch_mode=Dispatch.mesh(DP_MESH))
    def infer_batch(self, batch: DataProto) -> DataProto:
        """No-grad forward; ``meta_info["outputs"]`` picks the fields (default log_probs or
        values), ``meta_info["temperature"]`` the temperature."""
        outputs: Sequence[str] | None = batch.meta_info.get("outputs")
        if outputs is None:
            outputs = ("values",) if self.engine_config.model.value_head else ("log_probs",)
        return self.engine.infer_batch(batch, outputs=tuple(outputs))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save(self, path: str) -> None:
        self.engine.save(path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load(self, path: str) -> int:
        self.engine.load(path)
        return self.engine.global_step

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def offload(self) -> None:
        self.engine.offload()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def onload(self) -> None:
        self.engine.onload()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def global_step(self) -> int:
        return self.engine.global_step

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_weights(self, bucket_bytes: int = 512 * 1024 * 1024, dtype: Any = None) -> Any:
        """Full weights under Hugging Face names: a dict on DP rank 0, None elsewhere
        (every rank takes part in the gather)."""
        weights = {}
        for bucket in self.engine.export_weights(bucket_bytes=bucket_bytes, dtype=dtype):
            if self.engine.dp_rank == 0:
                weights.update({name: tensor.cpu() for name, tensor in bucket})
        return weights if self.engine.dp_rank == 0 else None

"""Deliberately broken FSDP engines, registered on import (every rank imports this module
through the conformance suite's ``engine_module``). Each has one classic distributed bug
that the single-rank checks miss; `test_conformance_catches_bugs` shows the suite fails."""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from rl_core.engine import ENGINES, EngineConfig
from rl_engines.fsdp import FSDPEngine


class NoGradSyncEngine(FSDPEngine):
    """Every rank a full replica (HSDP, shard size 1) that never all-reduces gradients:
    each rank steps on its own shard's gradient and the replicas drift apart."""

    def __init__(self, config: EngineConfig) -> None:
        parallel = dataclasses.replace(config.parallel, fsdp_size=1, replicate_size=-1)
        super().__init__(dataclasses.replace(config, parallel=parallel))
        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.set_requires_all_reduce(False, recurse=False)


class NonReshardingCheckpointEngine(FSDPEngine):
    """Claims resharding, but saves each rank's local shards and, on load, copies the
    shards whose shapes happen to fit and silently keeps the rest (and no optimizer state)."""

    supports_resharding = True

    def save(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        local = {
            n: (p.to_local() if isinstance(p, DTensor) else p).detach().clone()
            for n, p in self.model.named_parameters()
        }
        torch.save({"step": self._step, "params": local}, f"{path}/rank{dist.get_rank()}.pt")
        dist.barrier()

    def load(self, path: str) -> None:
        state = torch.load(f"{path}/rank{dist.get_rank()}.pt", weights_only=True)
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                dst = p.to_local() if isinstance(p, DTensor) else p
                src = state["params"].get(name)
                if src is not None and src.shape == dst.shape:
                    dst.copy_(src)
        self._step = state["step"]
        for _ in range(self._step):
            self.scheduler.step()


class StaleExportEngine(FSDPEngine):
    """Exports the weights it was built with, not the trained ones."""

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self._frozen = [[(n, t.clone()) for n, t in b] for b in super().export_weights()]

    def export_weights(self, bucket_bytes=512 * 1024 * 1024, dtype=None):
        for bucket in self._frozen:
            yield [(n, t.to(dtype) if dtype is not None else t) for n, t in bucket]


BROKEN = {
    "fsdp-no-grad-sync": NoGradSyncEngine,
    "fsdp-non-resharding-checkpoint": NonReshardingCheckpointEngine,
    "fsdp-stale-export": StaleExportEngine,
}
for _name, _cls in BROKEN.items():
    if _name not in ENGINES:
        ENGINES.register(_name, _cls)

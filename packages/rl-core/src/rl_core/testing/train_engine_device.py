"""Multi-rank checks of a `TrainEngine` on the stand-in device, whose process groups behave
like NCCL's (`rl_core.testing.standin_collectives`): a collective on a host tensor raises,
as it does on GPUs, so a CPU machine finds what would stop a first multi-GPU run.

Run by `TrainEngineDeviceConformance.test_collectives_on_standin` at world size 2, in
spawned processes: the training step, save and load (re-save, corrupt file), a save that
fails on one rank (every rank raises, the previous checkpoint stays), weight export
(with and without LoRA, merged) and an inference-only engine (the reference model, the
on-policy-distillation teacher). Offload/onload at world size 2 is
`test_device_contract_on_standin`'s.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from rl_core.checkpoint import CheckpointError, verify_manifest
from rl_core.engine import build_engine

__all__ = ["check_failed_save", "run_standin_collective_checks"]


@contextlib.contextmanager
def _failing_torch_save(message: str) -> Iterator[None]:
    """``torch.save`` to a file raises in this process (a full disk on one rank). Saves
    into memory still work, as they do on a full disk: megatron-core serialises its
    ShardedObjects into a BytesIO before its collective planning, and a rank failing there
    would leave the other ranks inside dist_checkpointing's collectives (a hang, not the
    failed save this check is about)."""
    original = torch.save

    def refuse(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(f, io.BytesIO):
            return original(obj, f, *args, **kwargs)
        raise OSError(28, message)

    torch.save = refuse
    try:
        yield
    finally:
        torch.save = original


def check_failed_save(spec: dict[str, Any]) -> None:
    """A save that fails on the last rank only: every rank raises `CheckpointError` naming
    that rank, the checkpoint saved before at the same path stays complete and loads."""
    import torch.distributed as dist

    from rl_core.testing.train_engine_checks import (
        _shard,
        _weights,
        engine_config,
        make_rl_batch,
        pg_loss,
    )

    path = os.path.join(spec["tmp"], "ckpt-failed-save")
    engine = build_engine(spec["engine"], engine_config(spec["model_dir"], spec["options"]))
    engine.train_batch(_shard(make_rl_batch(), engine), pg_loss)
    engine.save(path)
    saved = _weights(engine)
    manifest = verify_manifest(path)
    engine.train_batch(_shard(make_rl_batch(seed=1), engine), pg_loss)
    rank, last = dist.get_rank(), dist.get_world_size() - 1
    failing = _failing_torch_save("No space left on device (injected)")
    injected = failing if rank == last else contextlib.nullcontext()
    with injected, pytest.raises(CheckpointError, match="saving checkpoint") as info:
        engine.save(path)
    # every rank names the failure: the failing rank's own cause, or which rank failed
    message = str(info.value)
    assert "No space left" in message or f"[{last}]" in message, message
    assert verify_manifest(path)["files"].keys() == manifest["files"].keys()
    engine.close()
    again = build_engine(spec["engine"], engine_config(spec["model_dir"], spec["options"]))
    again.load(path)
    for name, tensor in _weights(again).items():
        assert torch.equal(tensor, saved[name]), f"{name} changed by the failed save"
    again.close()


def run_standin_collective_checks(spec: dict[str, Any]) -> dict[str, Any]:
    """Rank side: install the stand-in (NCCL-strict groups), then run the multi-rank checks
    named in ``spec["checks"]`` (default: all) with the engine on the stand-in device."""
    from rl_core.testing import train_engine_checks as train_engine
    from rl_core.testing.standin import DEVICE_TYPE, install

    install()
    os.environ["RL_PLATFORM"] = DEVICE_TYPE
    if spec.get("engine_module"):
        __import__(spec["engine_module"])
    checks = {
        "save_load": train_engine.check_save_load,
        "failed_save": check_failed_save,
        "export": train_engine.check_export,
        "export_lora": train_engine.check_export,
        # an inference-only engine: the reference model and the distillation teacher
        "inference_only": train_engine.check_inference_only,
    }
    ran = []
    for name in spec.get("checks") or list(checks):
        local = dict(spec, tmp=os.path.join(spec["tmp"], name), value_head=False)
        os.makedirs(local["tmp"], exist_ok=True)
        if name == "export_lora":
            lora = {"model": {"lora": {"rank": 4, "alpha": 8.0}}}
            local["options"] = train_engine._merge(local["options"], lora)
        checks[name](local)
        ran.append(name)
    return {"ran": ran}

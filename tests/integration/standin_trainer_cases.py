"""The process side of `test_standin_trainer.py`: a GRPO run whose workers are on the
stand-in accelerator (NCCL-strict groups), in a spawned process (the stand-in changes
process-wide torch state; the pytest process stays a plain CPU process)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def grpo_on_standin(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Two colocated FSDP2 workers with hf rollouts on ``standin``: train, sync weights,
    save a checkpoint, validate; returns the logged steps and the checkpoint's files."""
    import ray

    from rl_algos.config import load_config
    from rl_algos.trainer.loop import RLTrainer
    from rl_core.testing.standin import DEVICE_TYPE, install

    install()
    os.environ["RL_PLATFORM"] = DEVICE_TYPE
    ray.init(
        address="local",
        num_cpus=2,
        resources={DEVICE_TYPE: 2},
        include_dashboard=False,
        runtime_env={
            # every worker process installs the stand-in before it builds anything
            "worker_process_setup_hook": "rl_core.testing.standin.install",
            "env_vars": {"RL_PLATFORM": DEVICE_TYPE},
        },
    )
    try:
        trainer = RLTrainer(load_config(raw, overrides))
        try:
            history = trainer.fit()
        finally:
            trainer.close()
    finally:
        ray.shutdown()
    out = Path(raw["trainer"]["output_dir"])
    lines = (out / "metrics.jsonl").read_text().splitlines()
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())
    return {
        "steps": [h["step"] for h in history],
        "metrics": [json.loads(line) for line in lines],
        "checkpoints": checkpoints,
    }

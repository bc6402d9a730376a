"""Conformance suite for `rl_core.engine.TrainEngine` implementations.

Subclass `TrainEngineConformance` in your engine's tests and set ``engine_name`` (the
name your package registers under ``rl.engines``)::

    from rl_core.testing.train_engine import TrainEngineConformance

    class TestMyEngine(TrainEngineConformance):
        engine_name = "my-engine"
        engine_options = {"engine_kwargs": {"attn_implementation": "eager"}}  # optional

Every check runs SPMD on ``world_size`` spawned processes (gloo on CPU, default 1 and 2;
override the ``world_size`` fixture) on tiny random Hugging Face models (Qwen2 with tied
embeddings and Llama; override ``model_type``). Checks: training metrics and the first
loss against a float64 single-process Hugging Face reference (so the loss contract holds
for any DP size); log-probs, entropy and values against that reference; micro-batching
and token-budget batching give the same update as one big batch; save/load resumes
bit-exactly; an in-memory snapshot (engines with ``supports_snapshots``) restores
bit-exactly, into the same engine and a fresh one; exported weights load into a fresh Hugging Face model and reproduce the
engine's log-probs; offload/onload changes nothing; bad input and NaN losses fail clearly;
the device contract (the loss sees every tensor on ``engine.device``, `infer_batch`
returns CPU tensors; the reference losses use the batch exactly as given, so an engine
that hands over host tensors fails on an accelerator); entropy in `train_batch`;
``inference_only`` engines hold no optimizer and refuse to train.

`TrainEngineConformance.test_distributed` adds the distributed checks of
`rl_core.testing.train_engine_distributed` (gradients synchronised across 2 ranks and equal
to a single-process reference, checkpoints saved at world size 2 loading at world size 1,
exports equal to the trained weights). Set ``distributed = False`` for an engine that never
runs on more than one rank. An engine not installed by entry point can be registered by a
module every rank imports first: ``engine_module = "my_tests.register_engine"``.

Requires pytest; transformers is imported inside functions only (engines bring it).
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from rl_core.platform import get_platform
from rl_core.testing import train_engine_distributed as dist_checks
from rl_core.testing.spawn import SpawnRunner
from rl_core.testing.train_engine_checks import (
    CASES,
    DISTRIBUTED_CASES,
    _merge,
    check_standin_device,
    engine_class,
    engine_config,
    make_rl_batch,
    pg_loss,
    reference_outputs,
    run_check,
    run_standin_check,
    save_tiny_model,
    tiny_hf_config,
    value_loss,
)
from rl_core.testing.train_engine_checks import (
    VOCAB as VOCAB,  # re-exported for the suites' users
)
from rl_core.testing.train_engine_device import run_standin_collective_checks

__all__ = [
    "SpawnRunner",
    "TrainEngineConformance",
    "TrainEngineDeviceConformance",
    "check_standin_device",
    "engine_config",
    "make_rl_batch",
    "pg_loss",
    "reference_outputs",
    "run_standin_check",
    "save_tiny_model",
    "tiny_hf_config",
    "value_loss",
]


class TrainEngineConformance:
    """Subclass with ``engine_name`` set; every test runs one check on every rank.

    Cases are ``<check>-lm`` (causal LM) and ``<check>-value`` (value model with a scalar
    head). Override the ``world_size`` or ``model_type`` fixtures to change the matrix.
    """

    engine_name: ClassVar[str] = ""
    engine_options: ClassVar[dict[str, Any]] = {}
    engine_module: ClassVar[str] = ""
    distributed: ClassVar[bool] = True

    @pytest.fixture(scope="class", params=[1, 2], ids=lambda n: f"world{n}")
    @classmethod
    def world_size(cls, request) -> int:
        return request.param

    @pytest.fixture(scope="class")
    @classmethod
    def runner(cls, world_size) -> SpawnRunner:
        """Processes shared with every other user of `SpawnRunner.shared` in the session."""
        return SpawnRunner.shared(world_size)

    @pytest.fixture(scope="class", params=["qwen2", "llama"])
    @classmethod
    def model_type(cls, request) -> str:
        return request.param

    @pytest.fixture(scope="class")
    @classmethod
    def model_dirs(cls, model_type, tmp_path_factory) -> dict[str, str]:
        root = tmp_path_factory.mktemp(model_type)
        return {
            "lm": save_tiny_model(str(root / "lm"), model_type),
            "value": save_tiny_model(str(root / "value"), model_type, value_head=True),
        }

    @pytest.mark.parametrize("case", CASES)
    def test_conformance(self, case, runner, model_dirs, tmp_path) -> None:
        if not self.engine_name:
            pytest.fail(f"{type(self).__name__} must set engine_name")
        name, kind = case.rsplit("-", 1)
        options = dict(self.engine_options)
        if kind == "value":
            options = _merge(options, {"model": {"value_head": True}})
        spec = {
            "engine": self.engine_name,
            "engine_module": self.engine_module,
            "options": options,
            "model_dir": model_dirs[kind],
            "value_head": kind == "value",
            "tmp": str(tmp_path),
        }
        results = runner.run(run_check, name, spec)
        if name == "training":  # every rank reports the same, global, metrics
            assert all(r == results[0] for r in results), results

    @pytest.mark.parametrize("case", DISTRIBUTED_CASES)
    def test_distributed(self, case, model_dirs, tmp_path) -> None:
        """World size 2 against a single process; see `train_engine_distributed`."""
        spec = _spawn_spec(self, model_dirs["lm"])
        if not self.distributed:
            pytest.skip(f"{type(self).__name__} sets distributed = False")
        _require_devices(2)
        if case == "gradient_sync":
            results = SpawnRunner.shared(2).run(dist_checks.check_gradient_sync, spec)
            dist_checks.assert_same_weights(results, "after one step at world size 2")
            return
        cls = engine_class(self.engine_name, self.engine_module)
        spec["supports_resharding"] = bool(getattr(cls, "supports_resharding", False))
        spec["path"] = str(tmp_path / "ckpt-world2")
        saved = SpawnRunner.shared(2).run(dist_checks.check_reshard_save, spec)
        dist_checks.assert_same_weights([s["weights"] for s in saved], "saving run")
        loaded = SpawnRunner.shared(1).run(dist_checks.check_reshard_load, spec)[0]
        if spec["supports_resharding"]:
            dist_checks.assert_resumed_alike(saved[0], loaded, "saved at world size 2, loaded at 1")


def _require_devices(world_size: int) -> None:
    """Skip unless each of ``world_size`` ranks can have a device of its own: NCCL refuses
    two ranks on one GPU ("Duplicate GPU detected"). On CPU any number of ranks runs."""
    platform = get_platform()
    if platform.device_type != "cpu" and platform.device_count() < world_size:
        pytest.skip(
            f"world size {world_size} on {platform.name} needs {world_size} devices, this "
            f"machine shows {platform.device_count()} (the stand-in device suite, "
            "nox -s tests-device, runs these ranks on CPU)"
        )


def _spawn_spec(suite: Any, model_dir: str) -> dict[str, Any]:
    """What a suite's checks in spawned processes build the engine from (fails when the
    suite has no ``engine_name``)."""
    if not suite.engine_name:
        pytest.fail(f"{type(suite).__name__} must set engine_name")
    return {
        "engine": suite.engine_name,
        "engine_module": suite.engine_module,
        "options": dict(suite.engine_options),
        "model_dir": model_dir,
    }


class TrainEngineDeviceConformance:
    """The device contract on a device that is not the host (`rl_core.testing.standin`), so
    it fails on a CPU machine too: subclass with ``engine_name`` set (``engine_options``,
    ``engine_module`` as in `TrainEngineConformance`). The check runs in its own spawned
    processes (the stand-in changes process-wide torch state), world size 1 and 2."""

    engine_name: ClassVar[str] = ""
    engine_options: ClassVar[dict[str, Any]] = {}
    engine_module: ClassVar[str] = ""
    #: the smallest world size the layout runs at (TP/PP/EP 2 layouts: 2)
    min_world_size: ClassVar[int] = 1

    def save_model(self, path: str) -> str:
        """The tiny model the checks build the engine from (override for another
        architecture, e.g. a mixture of experts for an EP layout)."""
        return save_tiny_model(path, "qwen2")

    @pytest.mark.parametrize("world_size", [1, 2], ids=lambda n: f"world{n}")
    def test_device_contract_on_standin(self, world_size, tmp_path) -> None:
        if world_size < self.min_world_size:
            pytest.skip(f"the layout of {type(self).__name__} needs {self.min_world_size} ranks")
        spec = _spawn_spec(self, self.save_model(str(tmp_path / "lm")))
        with SpawnRunner(world_size, timeout_s=300.0) as runner:
            results = runner.run(run_standin_check, spec)
        assert all(r["offloaded"] < r["on_device"] for r in results), results

    #: the `train_engine_device` checks to run (a subclass may drop one it cannot support)
    standin_collective_checks: ClassVar[tuple[str, ...]] = (
        "save_load",
        "failed_save",
        "export",
        "export_lora",
        "inference_only",
    )

    def test_collectives_on_standin(self, tmp_path) -> None:
        """World size 2 with NCCL-strict process groups (a host tensor in a collective
        raises): save/load, a save failing on one rank, weight export, LoRA export."""
        spec = _spawn_spec(self, self.save_model(str(tmp_path / "lm")))
        spec.update(tmp=str(tmp_path), checks=list(self.standin_collective_checks))
        with SpawnRunner(2, timeout_s=600.0) as runner:
            results = runner.run(run_standin_collective_checks, spec)
        assert all(r["ran"] == list(self.standin_collective_checks) for r in results), results

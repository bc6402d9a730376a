"""Where metrics go: the console, a JSONL file, and optional experiment trackers.

`MetricsLogger` fans ``log(step, metrics)`` out to ``jsonl``, ``console`` and the configured
``tensorboard``, ``wandb``, ``mlflow`` (not installed: an error saying what to install);
`MetricsLogger.rewind` follows a failover (README: Failover). `plot_metrics` draws a PNG.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

__all__ = ["BACKENDS", "MetricsLogger", "plot_metrics", "read_jsonl"]

BACKENDS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
STEP_KEY = "trainer/step"  # W&B: the x-axis of every chart
REPLAYED_KEY = "failover/replayed"  # W&B, MLflow: a step logged again after a rewind
CONSOLE_KEYS = (
    "critic/score/mean",
    "val/accuracy",
    "val/plain_accuracy",
    "actor/pg_loss",
    "actor/entropy",
    "actor/grad_norm",
    "perf/tokens_per_s",
    "timing/step_s",
)


class _Backend(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def rewind(self, step: int, last: int) -> None:
        """The run goes back to `step` after logging up to `last` (module docstring)."""

    def close(self) -> None: ...


class _Jsonl:
    def __init__(self, path: Path, resume_step: int | None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and path.exists():
            # A resumed run rewrites history from its checkpoint: drop the lines of steps
            # after it (they were produced by the interrupted run and will be redone).
            kept = [r for r in read_jsonl(path) if r["step"] <= resume_step]
            path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self.file = open(path, "a" if resume_step is not None else "w")  # noqa: SIM115

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()

    def rewind(self, step: int, last: int) -> None:
        """Drop the lines of steps after `step` (they will be redone: failover)."""
        self.file.close()
        path = Path(self.file.name)
        kept = [r for r in read_jsonl(path) if r["step"] <= step]
        path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self.file = open(path, "a")  # noqa: SIM115

    def close(self) -> None:
        self.file.close()


class _Console:
    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        shown = [
            f"{k.split('/')[-2] if k.count('/') > 1 else k}={metrics[k]:.4g}"
            for k in CONSOLE_KEYS
            if k in metrics
        ]
        print(f"step {step}: " + "  ".join(shown), flush=True)

    def rewind(self, step: int, last: int) -> None:
        print(f"failover: back to step {step}; steps {step + 1}-{last} are replayed", flush=True)

    def close(self) -> None:
        pass


def _import_backend(backend: str, module: str, install: str) -> Any:
    """``module`` for logger ``backend``, or an ImportError saying what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"trainer.loggers includes {backend!r} but it is not installed: {install}"
        ) from exc


class _TensorBoard:
    def __init__(self, log_dir: Path) -> None:
        tensorboard = _import_backend(
            "tensorboard", "torch.utils.tensorboard", "pip install tensorboard"
        )
        self.writer = tensorboard.SummaryWriter(str(log_dir))
        self._writer_class = tensorboard.SummaryWriter
        self._log_dir = log_dir

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def rewind(self, step: int, last: int) -> None:
        # a purge marker: TensorBoard drops the earlier events of steps >= step + 1
        self.writer.close()
        self.writer = self._writer_class(str(self._log_dir), purge_step=step + 1)

    def close(self) -> None:
        self.writer.close()


class _WandB:
    """A W&B run whose local files go to ``<output_dir>/wandb`` (``WANDB_MODE=offline``
    keeps it off the network; ``wandb sync`` uploads it later)."""

    def __init__(
        self, project: str, run_name: str, config: Mapping[str, Any], output_dir: Path
    ) -> None:
        self.wandb = wandb = _import_backend("wandb", "wandb", "pip install wandb")
        output_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project, name=run_name, config=dict(config), dir=str(output_dir)
        )
        # every chart's x-axis: the training step (W&B's own _step only ever increases)
        self.run.define_metric(STEP_KEY)
        self.run.define_metric("*", step_metric=STEP_KEY)
        self._last = -1
        self._rewinds = 0

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        row = {**metrics, STEP_KEY: step}
        if step <= self._last:
            row[REPLAYED_KEY] = 1.0
        self.run.log(row)
        self._last = max(self._last, step)

    def rewind(self, step: int, last: int) -> None:
        self._rewinds += 1
        self.run.summary["failover/rewinds"] = self._rewinds

    def close(self) -> None:
        self.run.finish()


class _MLflow:
    """An MLflow run on the server or store of ``MLFLOW_TRACKING_URI``; without it, a local
    SQLite store ``<output_dir>/mlflow.db`` (``mlflow ui --backend-store-uri sqlite:///...``)."""

    def __init__(
        self, project: str, run_name: str, config: Mapping[str, Any], output_dir: Path
    ) -> None:
        self.mlflow = mlflow = _import_backend("mlflow", "mlflow", "pip install 'rl-algos[mlflow]'")
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            output_dir.mkdir(parents=True, exist_ok=True)
            mlflow.set_tracking_uri(f"sqlite:///{output_dir.resolve() / 'mlflow.db'}")
        mlflow.set_experiment(project)
        mlflow.start_run(run_name=run_name)
        mlflow.log_params({k: str(v)[:250] for k, v in _flatten(config).items()})
        self._last = -1
        self._rewinds = 0

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        safe = {k.replace("@", "_at_"): v for k, v in metrics.items()}
        if step <= self._last:
            safe[REPLAYED_KEY] = 1.0
        self.mlflow.log_metrics(safe, step=step)
        self._last = max(self._last, step)

    def rewind(self, step: int, last: int) -> None:
        self._rewinds += 1
        self.mlflow.set_tag(
            f"failover.rewind.{self._rewinds}",
            f"back to step {step} after step {last}: steps {step + 1}-{last} logged twice "
            f"(the later values, {REPLAYED_KEY}=1, are the run's)",
        )

    def close(self) -> None:
        self.mlflow.end_run()


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


class MetricsLogger:
    """Send each step's metrics to every configured backend; with ``resume_step`` the JSONL
    file keeps its history up to that step."""

    def __init__(
        self,
        backends: Iterable[str],
        output_dir: str | os.PathLike,
        project: str = "rl",
        run_name: str = "run",
        config: Mapping[str, Any] | None = None,
        resume_step: int | None = None,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.jsonl_path = self.output_dir / "metrics.jsonl"
        self.backends: list[_Backend] = []
        self._last = -1 if resume_step is None else resume_step  # the newest step logged
        for name in backends:
            if name not in BACKENDS:
                raise ValueError(
                    f"trainer.loggers: unknown backend {name!r}; allowed: {list(BACKENDS)}"
                )
            if name == "console":
                self.backends.append(_Console())
            elif name == "jsonl":
                self.backends.append(_Jsonl(self.jsonl_path, resume_step))
            elif name == "tensorboard":
                self.backends.append(_TensorBoard(self.output_dir / "tensorboard"))
            elif name == "wandb":
                self.backends.append(_WandB(project, run_name, config or {}, self.output_dir))
            else:
                self.backends.append(_MLflow(project, run_name, config or {}, self.output_dir))

    def rewind(self, step: int) -> None:
        """Failover went back to `step`: every backend follows if later steps were logged."""
        if step >= self._last:
            return  # nothing after it was logged: nothing is replayed
        for backend in self.backends:
            backend.rewind(step, self._last)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        clean = {
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, int | float) and math.isfinite(float(v))
        }
        for backend in self.backends:
            backend.log(step, clean)
        self._last = max(self._last, step)

    def close(self) -> None:
        for backend in self.backends:
            backend.close()


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a metrics JSONL file, in order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_metrics(
    jsonl_path: str | os.PathLike,
    png_path: str | os.PathLike,
    keys: Iterable[str] = (
        "critic/score/mean",
        "val/accuracy",
        "val/plain_accuracy",
        "val/boxed",
        "val/plain_boxed_share",
        "val/score",
        "actor/entropy",
        "response_length/mean",
    ),
) -> list[str]:
    """Plot the given metrics of a run against the step into one PNG; return those drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_jsonl(jsonl_path)
    present = [k for k in keys if any(k in r for r in rows)]
    if not present:
        return []
    fig, axes = plt.subplots(len(present), 1, figsize=(7, 2.4 * len(present)), squeeze=False)
    for ax, key in zip(axes[:, 0], present, strict=True):
        points = [(r["step"], r[key]) for r in rows if key in r]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3)
        ax.set_ylabel(key, fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return present

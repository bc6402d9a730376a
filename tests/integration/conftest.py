"""Shared pieces of the end-to-end tests: an embedded Ray cluster, prompt files, configs.

These tests need the training engine (rl-engines[fsdp]), the rollout (rl-rollout[hf]) and
rl-algos together, so they run in the full workspace environment (`nox -s
tests-integration`), never in a package's isolated session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

# before anything imports ray: workers share this interpreter (no uv-run working-dir copy)
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
REWARD_FILE = HERE / "digit_reward.py"
TARGETS = "0123456789"
WORDS = [
    *("apple", "river", "cloud", "stone", "light", "green", "house", "quiet"),
    *("tiger", "piano", "ocean", "maple", "candle", "bridge", "forest", "silver"),
]
# RL_E2E_SEED=<n> reruns the learning tests with another seed (how their margins were
# checked for robustness); CI uses the default.
SEED = int(os.environ.get("RL_E2E_SEED", "0"))


def _rows(words: Sequence[str], offset: int) -> list[dict[str, Any]]:
    return [
        {
            "prompt": [{"role": "user", "content": f"Say {word}"}],
            "data_source": "digits",
            "reward_model": {"style": "rule", "ground_truth": TARGETS},
            "extra_info": {"index": offset + i},
        }
        for i, word in enumerate(words)
    ]


@pytest.fixture(scope="session")
def prompt_files(tmp_path_factory) -> dict[str, str]:
    """32 training prompts and 8 held-out prompts (verl-style jsonl rows)."""
    from rl_algos.data import write_rows

    root = tmp_path_factory.mktemp("prompts")
    train = write_rows(_rows(WORDS * 2, 0), root / "train.jsonl")
    val = write_rows(_rows([f"{w}s" for w in WORDS[:8]], 100), root / "val.jsonl")
    return {"train": str(train), "val": str(val)}


def base_config(prompt_files: dict[str, str], output_dir: Path, preset: str) -> dict[str, Any]:
    """A run of the tiny random model on the digit task: 4 prompts x n samples per step,
    2 mini-batches (2 optimizer steps) per step, 2 FSDP workers each with an hf rollout."""
    return {
        "model": {"path": "tiny-random:qwen2"},
        "data": {
            "train_files": [prompt_files["train"]],
            "val_files": [prompt_files["val"]],
            "max_prompt_length": 32,
            "max_response_length": 8,
            "train_batch_size": 4,
        },
        "algorithm": {"preset": preset},
        "actor": {"optim": {"lr": 1e-2}, "mini_batch_size": 2},
        "reward": {"function_path": str(REWARD_FILE), "num_workers": 0},
        "trainer": {
            "output_dir": str(output_dir),
            "seed": SEED,
            "total_steps": 10,
            "num_workers": 2,
            "ray_num_cpus": 2,
            "progress_bar": False,
            "loggers": ["jsonl"],
            "val_every": 0,
            "val_before_train": False,
            "save_every": 0,
            "call_timeout_s": 300,
        },
    }


@pytest.fixture(scope="module")
def ray_cluster():
    """One embedded Ray cluster (2 CPUs) per test module; trainers find it initialised."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def make_config(prompt_files, tmp_path) -> Callable[..., Any]:
    """make_config(preset, overrides=(), output_dir=None, **sections) -> validated RLConfig."""
    from rl_algos.config import load_config

    def make(preset: str, overrides: Sequence[str] = (), output_dir: Path | None = None) -> Any:
        raw = base_config(prompt_files, output_dir or tmp_path / "run", preset)
        return load_config(raw, list(overrides))

    return make


@pytest.fixture
def raw_config(prompt_files) -> Callable[[Path, str], dict[str, Any]]:
    """raw_config(output_dir, preset) -> the plain config mapping (for YAML files)."""
    return lambda output_dir, preset: base_config(prompt_files, output_dir, preset)


@pytest.fixture
def run_rl() -> Callable[..., subprocess.CompletedProcess]:
    """run_rl(*args, cwd, timeout=800): the `rl` console script of this environment, as a
    user runs it (without the test's RAY_ADDRESS)."""

    def run(*args: str, cwd: Path, timeout: float = 800) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        command = [str(Path(sys.executable).with_name("rl")), *args]
        return subprocess.run(
            command, capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env
        )

    return run


@pytest.fixture
def kill_once() -> Callable[..., None]:
    """``kill_once(group, method, pid, sig=SIGKILL)``: send `sig` to worker `pid` as the
    group's next `method` call is dispatched (once), i.e. mid-call from the controller's
    point of view (SIGSTOP: a worker that hangs)."""

    def arm(group: Any, method: str, pid: int, sig: int = signal.SIGKILL) -> None:
        original = getattr(group, method)

        def call(*args: Any, **kwargs: Any) -> Any:
            setattr(group, method, original)
            threading.Timer(0.0, os.kill, (pid, sig)).start()
            return original(*args, **kwargs)

        setattr(group, method, call)

    return arm

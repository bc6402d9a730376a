"""`rl train CONFIG --dry-run`: every example checks out and prints its resolved config and
placement; a bad config fails naming the field; nothing (Ray, a worker) starts."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest
from omegaconf import OmegaConf

from rl_algos.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.yaml"))


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the examples name files relative to the repository
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _dry_run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["train", *args, "--dry-run"])
    out, err = capsys.readouterr()
    return code, out, err


def _placement(out: str) -> dict[str, str]:
    """role -> its placement line (the ``#   role ...`` lines after the config)."""
    lines = out.split("# placement", 1)[1].splitlines()[1:]
    return {line.split()[1]: " ".join(line.split()[2:]) for line in lines}


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_dry_runs(example, capsys):
    path = ROOT / "examples" / example
    code, out, err = _dry_run(capsys, str(path))
    assert code == 0, err
    printed = OmegaConf.create(out.split("# placement", 1)[0])
    given = OmegaConf.load(path)
    assert printed.model.path == given.model.path
    assert printed.trainer.total_steps == given.trainer.total_steps
    roles = _placement(out)
    assert "actor" in roles and roles["actor"].startswith(
        "pool local" if given.trainer.get("backend") == "local" else "pool actor"
    )


def test_placement_numbers(capsys):
    """grpo_tiny: 2 workers on trainer.ray_num_cpus=2 take 1 CPU each; the reference and the
    rollout share their processes. A split critic gets a pool of its own."""
    code, out, _ = _dry_run(capsys, "examples/grpo_tiny.yaml")
    roles = _placement(out)
    assert code == 0
    assert roles["actor"] == "pool actor 2 process(es), 1 CPU + 1 accelerator (0 on CPU) each"
    assert roles["reference"] == roles["rollout"] == roles["actor"]
    assert roles["reward_fn"] == "pool driver 1 process(es), subprocesses"
    overrides = ["algorithm.preset=ppo", "critic.placement=split", "trainer.num_workers=1"]
    code, out, _ = _dry_run(capsys, "examples/grpo_tiny.yaml", *overrides)
    roles = _placement(out)
    assert roles["critic"] == "pool critic 1 process(es), 1 CPU + 1 accelerator (0 on CPU) each"
    assert "reference" not in roles  # PPO's preset has no KL loss


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("actor.optim.lrr=3", "actor.optim.lrr"),
        ("trainer.num_workers=0", "trainer.num_workers"),
        ("trainer.num_workers=8", "trainer.ray_num_cpus"),  # 8 workers on 2 CPUs do not fit
        # the engine's own options, checked where start-up checks them (the worker config)
        ("actor.engine_kwargs={logprob_chunk_tokens: -5}", "actor.engine_kwargs.logprob_chunk"),
    ],
)
def test_bad_config_fails_naming_the_field(override, named, capsys):
    code, out, err = _dry_run(capsys, "examples/grpo_tiny.yaml", override)
    assert code == 2 and out == ""
    assert err.startswith(f"rl train: config error: {named}") and err.count("\n") == 1


def test_nothing_starts(capsys, tmp_path, monkeypatch):
    """No Ray (no session, not initialised) and no child process, in this process."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    code, _, _ = _dry_run(capsys, "examples/opd_tiny.yaml", f"trainer.output_dir={tmp_path}/out")
    assert code == 0
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after <= before
    assert os.listdir(tmp_path) == []  # no Ray session dir, no output dir
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()

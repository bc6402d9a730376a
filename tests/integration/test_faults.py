"""Fault injection (``nox -s tests-faults``): real runs of the trainer on the tiny random
model, with faults injected mid-step. Each case asserts a named error or a run that goes
on, that no checkpoint is lost, and that no process is left behind.

* reward functions that hang, raise, return NaN, 1e301 or a wrong type, or kill their
  scoring worker process (one trainer, in-process engine: ``trainer.backend=local``);
* a full disk during a checkpoint save: a small tmpfs mounted by the test (needs root;
  skipped otherwise), then corrupted and truncated checkpoints on the same run;
* a killed training worker (during ``update_actor``) and a killed rollout worker (during
  ``generate_sequences``; the rollout shares the actor's process, the hybrid engine) on
  one embedded Ray cluster.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from rl_algos.config import load_config
from rl_algos.rewards.manager import RewardFailureError
from rl_algos.trainer.checkpoints import find_resume_checkpoint
from rl_algos.trainer.loop import RLTrainer
from rl_core.checkpoint import (
    CheckpointCorruptError,
    CheckpointError,
    staging_path,
    verify_manifest,
)
from rl_core.single_controller.errors import WorkerDiedError

pytestmark = [pytest.mark.faults, pytest.mark.slow]

HERE = Path(__file__).resolve().parent


def _config(raw: dict[str, Any], overrides: list[str]) -> Any:
    return load_config(raw, ["actor.loss.kl_loss_coef=0", *overrides])


def _local(raw_config, out: Path, *overrides: str) -> Any:
    raw = raw_config(out, "grpo")
    raw["trainer"].update(backend="local", num_workers=1)
    return _config(raw, list(overrides))


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process from /proc, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def _children() -> set[int]:
    """Every live descendant of this process."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) and stat[0] != "Z":
            parents[int(entry.name)] = stat[1]
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _gone(pids: set[int], timeout_s: float = 60) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        alive = [p for p in pids if (stat := _stat(p)) is not None and stat[0] != "Z"]
        if not alive:
            return True
        time.sleep(0.5)
    return False


# ---------------------------------------------------------------------- rewards


def test_reward_functions_that_hang_raise_or_return_garbage(raw_config, tmp_path):
    before = _children()
    config = _local(
        raw_config,
        tmp_path / "rewards",
        f"reward.function_path={HERE / 'faulty_reward.py'}",
        "reward.num_workers=2",
        "reward.timeout_s=3",
        "reward.batch_timeout_s=120",
        "reward.error_score=-1",
        "data.train_batch_size=8",
        "data.shuffle=false",  # step 1 sees prompts 0..7: one of each behaviour
    )
    n = config.rollout.n
    trainer = RLTrainer(config)
    try:
        workers_seen: set[int] = set()
        batch, metrics = trainer._rollout({}, 0)
        workers_seen |= {w.process.pid for w in trainer.reward._pool._workers}
        # half the calls fail (hang, raise, wrong type, killed worker): the default
        # reward.max_failure_fraction=0.5 lets the step go on, every failure counted
        assert metrics["reward/timeouts"] == n  # hang
        assert metrics["reward/errors"] == 3 * n  # raise, wrong type, killed worker
        assert metrics["reward/nonfinite"] == n and metrics["reward/out_of_range"] == n
        assert trainer.reward._pool.restarts >= 2  # the hung and the killed workers
        scores = batch.batch["token_level_scores"].sum(-1)
        index = torch.tensor([int(e["index"]) for e in batch.non_tensor_batch["extra_info"]])
        expected = {0: 0.5, 1: -1.0, 2: -1.0, 3: -1.0, 4: 1e4, 5: -1.0, 6: -1.0, 7: 0.5}
        for i, value in expected.items():  # NaN -> error_score, 1e301 clipped to max_score
            assert (scores[index == i] == value).all(), (i, scores[index == i])
        # the whole step trains on these finite rewards
        step = trainer.train_step()
        assert all(torch.isfinite(torch.tensor(v)) for v in step.values()), step
        # a stricter limit makes the same faults stop the run, naming the cause
        trainer.reward.limits.max_failure_fraction = 0.25
        with pytest.raises(RewardFailureError, match=r"of \d+ reward calls failed .*0\.25"):
            trainer.train_step()
        workers_seen |= {w.process.pid for w in trainer.reward._pool._workers}
    finally:
        trainer.close()
    assert _gone(workers_seen), "scoring worker processes outlived the trainer"
    assert _gone(_children() - before), "processes left behind"


# ---------------------------------------------------------------------- checkpoints


@contextlib.contextmanager
def _tmpfs(path: Path, size_mb: int):
    """A small tmpfs at `path` (root only): a disk that fills up for real."""
    path.mkdir(parents=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs to fill needs root")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _flip_byte(path: Path) -> None:
    with path.open("r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_full_disk_during_a_save_and_corrupt_checkpoints(raw_config, tmp_path, caplog):
    with _tmpfs(tmp_path / "disk", 64) as disk:
        config = _local(raw_config, disk / "run", "trainer.max_checkpoints=5")
        trainer = RLTrainer(config)
        root = disk / "run" / "checkpoints"
        try:
            trainer.train_step()
            step_1 = trainer.save_checkpoint()
            size = sum(f.stat().st_size for f in step_1.rglob("*") if f.is_file())
            # fill the disk so that only half a checkpoint fits, then save mid-run
            free = shutil.disk_usage(disk).free
            filler = disk / "filler"
            with filler.open("wb") as f:
                f.truncate(0)
                f.write(b"\0" * max(0, free - size // 2))
            trainer.train_step()
            with pytest.raises(CheckpointError, match=r"saving checkpoint .*step_2 failed") as err:
                trainer.save_checkpoint()
            message = str(err.value)
            free_mib = float(re.search(r"free space on that file system: ([\d.]+) MiB", message)[1])
            assert free_mib * 2**20 < size, message  # names the full disk
            assert "CheckpointException" not in message, message  # torch's cause, unwrapped
            assert "kept the earlier checkpoints: step_1" in message
            verify_manifest(step_1)  # nothing lost
            assert (root / "latest").read_text() == "step_1"
            assert not staging_path(root / "step_2").exists()
            assert sorted(p.name for p in root.iterdir()) == ["latest", "step_1"]
            filler.unlink()  # space again: the run saves and goes on
            step_2 = trainer.save_checkpoint()
            assert (root / "latest").read_text() == "step_2"

            # corrupt the newest checkpoint: `latest` falls back to step_1, saying so
            victim = max(step_2.joinpath("actor").glob("*.distcp"), key=lambda p: p.stat().st_size)
            _flip_byte(victim)
            with caplog.at_level("WARNING"):
                assert find_resume_checkpoint(root, "latest") == step_1
            assert f"falling back to {step_1}" in caplog.text
            assert f"actor/{victim.name}: contents changed (sha256 mismatch)" in caplog.text
            with pytest.raises(CheckpointCorruptError, match=rf"actor/{victim.name}: contents"):
                find_resume_checkpoint(root, str(step_2))
            # the engine itself refuses it too, naming the file (all ranks)
            with pytest.raises(Exception, match=rf"{victim.name}: contents changed"):
                trainer.groups.actor.load_checkpoint(str(step_2 / "actor"))
            # truncated: named as such
            with victim.open("r+b") as f:
                f.truncate(victim.stat().st_size // 2)
            with pytest.raises(CheckpointCorruptError, match="truncated or extended"):
                find_resume_checkpoint(root, str(step_2))
            # the intact one loads for real and the run continues from it
            trainer._load_checkpoint(step_1)
            assert trainer.global_step == 1
            trainer.train_step()
            assert trainer.global_step == 2
        finally:
            trainer.close()


# ---------------------------------------------------------------------- workers


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        yield
    finally:
        ray.shutdown()


def _kill_during(group: Any, method: str, pid: int, delay_s: float) -> None:
    """Make the group's next `method` call SIGKILL worker `pid` `delay_s` after it was
    dispatched (while the ranks run it)."""
    original = getattr(group, method)

    def call(*args: Any, **kwargs: Any) -> Any:
        threading.Timer(delay_s, os.kill, (pid, signal.SIGKILL)).start()
        return original(*args, **kwargs)

    setattr(group, method, call)


@pytest.mark.ray
@pytest.mark.parametrize(
    ("method", "role", "delay_s"),
    # both calls can finish in well under a second on a fast machine: the kill follows
    # the dispatch at once, so it always lands while the call is outstanding
    [("update_actor", "training worker", 0.0), ("generate_sequences", "rollout worker", 0.0)],
)
def test_a_worker_killed_mid_step_is_named(
    ray_cluster, raw_config, tmp_path, method, role, delay_s
):
    import ray

    raw = raw_config(tmp_path / "run", "grpo")
    raw["trainer"].update(call_timeout_s=120)
    trainer = RLTrainer(_config(raw, []))
    root = tmp_path / "run" / "checkpoints"
    try:
        pids = [ray.get(w.ping.remote()) for w in trainer.groups.actor.workers]
        saved = trainer.save_checkpoint()  # step_0: the checkpoint that must survive
        _kill_during(trainer.groups.actor, method, pids[1], delay_s=delay_s)
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match=rf"rank 1.* died during {method}\(\)"):
            trainer.train_step()
        assert time.monotonic() - start < 100  # named promptly, not at a time-out
        verify_manifest(saved)  # no checkpoint lost
        assert find_resume_checkpoint(root, "latest") == saved
    finally:
        trainer.close()
    assert _gone(set(pids)), f"{role}: worker processes left behind"

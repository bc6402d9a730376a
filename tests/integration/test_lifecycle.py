"""Killing a running `rl train` leaves nothing behind.

A real ``rl train examples/grpo_tiny.yaml`` (embedded Ray, 2 workers, a reward worker)
runs with an environment marker of this test's own; once its workers run, the driver
gets SIGKILL, SIGTERM or SIGINT. Every process it started (its process tree as seen
just before the signal, Ray's agents included, plus any process carrying the marker) must
be gone: workers within 30 s, everything within 120 s. SIGTERM and SIGINT must also
end the command cleanly: exit status 128 + signal and one line saying so.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "examples" / "grpo_tiny.yaml")
RL = Path(sys.executable).with_name("rl")
MARKER = "RL_TEST_LIFECYCLE_RUN"
WORKERS_LIMIT_S = 30.0
ALL_LIMIT_S = 120.0


def _procs() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state, command line) of every process, from /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        table[int(name)] = (int(rest[1]), rest[0], cmd)
    return table


def _has_marker(pid: int, token: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{MARKER}={token}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def started_by(driver: int, token: str) -> dict[int, str]:
    """pid -> command of the driver's living descendants and of every marked process."""
    table = _procs()
    found: dict[int, str] = {}
    todo = [driver]
    while todo:
        parent = todo.pop()
        for pid, (ppid, state, cmd) in table.items():
            if ppid == parent and pid not in found and state != "Z":
                found[pid] = cmd
                todo.append(pid)
    for pid, (_, state, cmd) in table.items():
        if state != "Z" and pid != driver and _has_marker(pid, token):
            found[pid] = cmd
    return found


def still_running(pids: dict[int, str], token: str) -> dict[int, str]:
    """Which of `pids` still run (a zombie has exited; only its parent's wait is missing),
    plus any marked process started since."""
    table = _procs()
    alive = {p: c for p, c in pids.items() if p in table and table[p][1] not in ("Z", "X")}
    for pid, (_, state, cmd) in table.items():
        if state not in ("Z", "X") and pid not in alive and _has_marker(pid, token):
            alive[pid] = cmd
    return alive


def short_name(cmd: str) -> str:
    """``raylet``, ``ray::DashboardAgent``, ``rl_algos.rewards.worker``, ``_watchdog.py``..."""
    words = cmd.split(" ")
    if not words[0].rsplit("/", 1)[-1].startswith("python"):
        return words[0].rsplit("/", 1)[-1]
    args = [w for w in words[1:] if w and not w.startswith("-")]
    return (
        words[words.index("-m") + 1]
        if "-m" in words
        else (args or ["python"])[0].rsplit("/", 1)[-1]
    )


def is_worker(cmd: str) -> bool:
    """A Ray worker (``ray::IDLE``, ``ray::RayWorkerHost...``) or a reward worker."""
    ray_worker = cmd.startswith("ray::") and not cmd.endswith("Agent")
    return ray_worker or "rl_algos.rewards.worker" in cmd


def wait_for(condition, limit_s: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"rl train exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"rl train not ready within {limit_s} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


@pytest.mark.parametrize(
    ("sig", "when"),
    [
        (signal.SIGKILL, "training"),
        (signal.SIGTERM, "training"),
        (signal.SIGINT, "workers-starting"),
    ],
    ids=["SIGKILL", "SIGTERM", "SIGINT"],
)
def test_rl_train_leaves_no_process_behind(tmp_path, sig, when):
    assert RL.is_file(), f"the rl console script is not installed next to {sys.executable}"
    token = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env[MARKER] = token
    log = tmp_path / "rl.log"
    args = [
        *("trainer.total_steps=1000", "trainer.val_every=0", "trainer.save_every=0"),
        *("trainer.val_before_train=false", f"trainer.output_dir={tmp_path / 'out'}"),
    ]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(RL), "train", TINY, *args], cwd=tmp_path, env=env, stdout=out, stderr=out
        )
    seen: dict[int, str] = {}
    try:

        def ray_workers() -> int:
            seen.update(started_by(proc.pid, token))
            return sum(c.startswith("ray::RayWorkerHost") for c in seen.values())

        if when == "training":
            wait_for(lambda: "step 1:" in log.read_text(), 600, proc, log)
        else:
            wait_for(lambda: ray_workers() >= 2, 600, proc, log)
        seen.update(started_by(proc.pid, token))
        commands = " | ".join(seen.values())
        for part in ("raylet", "gcs_server", "ray::DashboardAgent", "ray::RuntimeEnvAgent"):
            assert part in commands, f"{part} not among the processes: {commands}"
        assert ray_workers() == 2, commands

        os.kill(proc.pid, sig)
        start = time.monotonic()
        workers_gone = None
        timeline: list[str] = []  # what still ran, whenever that changed (for the report)
        while True:
            alive = still_running(seen, token)
            took = time.monotonic() - start
            names = " ".join(sorted(short_name(c) for c in alive.values()))
            if not timeline or not timeline[-1].endswith(f"[{names}]"):
                timeline.append(f"{took:5.1f} s [{names}]")
            if workers_gone is None and not any(is_worker(c) for c in alive.values()):
                workers_gone = took
            assert workers_gone is not None or took < WORKERS_LIMIT_S, (
                f"workers still running {WORKERS_LIMIT_S} s after {sig.name}: {alive}\n{timeline}"
            )
            assert took < ALL_LIMIT_S, (
                f"still running {ALL_LIMIT_S} s after {sig.name}: {alive}\n{timeline}"
            )
            if not alive:
                break
            time.sleep(0.25)
        print(f"{sig.name}: workers gone after {workers_gone:.1f} s, everything after {took:.1f} s")
        print("\n".join(timeline))
        code = proc.wait(timeout=30)
        text = log.read_text()
        if sig == signal.SIGKILL:
            assert code == -signal.SIGKILL
        else:
            assert code == 128 + sig, text[-3000:]
            lines = [ln for ln in text.splitlines() if ln.startswith("rl train: stopped by")]
            assert lines == [f"rl train: stopped by {sig.name}; the workers and Ray were shut down"]
            assert "Traceback" not in text.split("rl train: stopped by")[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in still_running(seen, token):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

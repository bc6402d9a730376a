"""Driver-death watchdog of an embedded Ray (run as a script: standard library only).

``python -I _watchdog.py DRIVER_PID DRIVER_START TOKEN`` waits while the driver process
(identified by pid and start time, so a reused pid is not mistaken for it) is alive,
remembering its descendants. When the driver is gone, however it died (SIGKILL
included), it kills with SIGKILL:

* every process whose environment carries ``RL_RAY_DRIVER=TOKEN`` (the driver sets it
  before starting Ray, so Ray's head processes, its workers and everything they start,
  e.g. vLLM engine processes, inherit it), and
* every descendant of the driver it saw while the driver lived (Ray's DashboardAgent and
  RuntimeEnvAgent do not inherit the driver's environment; orphaned by the raylet, they
  otherwise linger about a minute).

It runs in its own session, so a Ctrl-C or a signal to the driver's process group does
not reach it, and it exits once the cleanup is done (or at once when the driver exited
with nothing left behind).
"""

from __future__ import annotations

import os
import signal
import sys
import time

ENV_VAR = "RL_RAY_DRIVER"
POLL_S = 0.2  # how often the driver's liveness is checked
SCAN_S = 1.0  # how often its descendants are recorded
SWEEPS = 5  # most rounds of killing after its death (catches processes started meanwhile)
SWEEP_GAP_S = 0.5


def proc_stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time in clock ticks, state) of a process, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[19]), fields[0]


def is_alive(pid: int, start: int) -> bool:
    stat = proc_stat(pid)
    return stat is not None and stat[1] == start and stat[2] not in ("Z", "X")


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of every living descendant of `root`."""
    children: dict[int, list[tuple[int, int]]] = {}
    for pid in _pids():
        stat = proc_stat(pid)
        if stat is not None:
            children.setdefault(stat[0], []).append((pid, stat[1]))
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        for pid, start in children.get(todo.pop(), ()):
            if pid not in found:
                found[pid] = start
                todo.append(pid)
    return found


def marked(token: str) -> dict[int, int]:
    """pid -> start time of every process whose environment carries the driver's token."""
    needle = f"{ENV_VAR}={token}".encode()
    found: dict[int, int] = {}
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        stat = proc_stat(pid)
        if needle in env and stat is not None:
            found[pid] = stat[1]
    return found


def sweep(token: str, seen: dict[int, int]) -> int:
    """Kill every living marked or seen process (never this one); return how many."""
    killed = 0
    for pid, start in {**seen, **marked(token)}.items():
        if pid == os.getpid() or not is_alive(pid, start):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except OSError:
            pass
    return killed


def watch(driver_pid: int, driver_start: int, token: str) -> int:
    seen: dict[int, int] = {}
    next_scan = 0.0
    while is_alive(driver_pid, driver_start):
        now = time.monotonic()
        if now >= next_scan:
            seen = {p: s for p, s in seen.items() if is_alive(p, s)}
            seen.update(descendants(driver_pid))
            next_scan = now + SCAN_S
        time.sleep(POLL_S)
    killed = 0
    for _ in range(SWEEPS):  # again while there was something to kill
        now_killed = sweep(token, seen)
        killed += now_killed
        if not now_killed:
            break
        time.sleep(SWEEP_GAP_S)
    return killed


def main(argv: list[str]) -> int:
    for name in ("SIGINT", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    driver_pid, driver_start, token = int(argv[0]), int(argv[1]), argv[2]
    killed = watch(driver_pid, driver_start, token)
    if killed:
        print(
            f"rl-core Ray watchdog: driver {driver_pid} is gone; killed {killed} leftover "
            "process(es) of its embedded Ray",
            file=sys.stderr,
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

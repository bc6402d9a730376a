"""Running one sandbox process on this host: the local backends' shared parent side.

It starts the command (first joining the run's cgroups, so nothing escapes the count), feeds
the code on stdin, reads stdout/stderr up to ``max_output_bytes`` each, enforces the
wall-clock limit and kills the whole tree when a limit is hit.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rl_rollout.tools.sandbox.cgroups import RunCgroup
from rl_rollout.tools.sandbox.config import SandboxConfig


@dataclass
class ProcessOutcome:
    """What the parent saw of one run."""

    stdout: bytes
    stderr: bytes
    stdout_cut: bool
    stderr_cut: bool
    killed: str | None
    returncode: int
    pid: int
    status: dict[str, Any] = field(default_factory=dict)


def signal_reason(sig: int, config: SandboxConfig) -> str:
    if sig == signal.SIGXCPU:
        return f"cpu time limit ({config.cpu_time_s} s)"
    if sig == signal.SIGXFSZ:
        return f"file size limit ({config.max_file_size_mb} MiB)"
    if sig == signal.SIGKILL:
        return "killed by SIGKILL (cpu hard limit or out of memory)"
    return f"terminated by signal {signal.Signals(sig).name}"


def _join_cgroups_then_exec(argv: list[str], cgroup: RunCgroup | None) -> list[str]:
    """Prefix `argv` with a shell that joins the run's cgroups, then execs it."""
    if cgroup is None:
        return argv
    joins = " && ".join(f"echo $$ > {shlex.quote(p)}" for p in cgroup.procs_files)
    return ["/bin/sh", "-c", f'{joins} && exec "$@"', "sandbox-join", *argv]


def _kill_group(pid: int | None) -> None:
    if pid is not None:
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)


def run_process(
    build_argv: Callable[[int], list[str]],
    code: str,
    config: SandboxConfig,
    env: dict[str, str],
    cwd: str | None,
    cgroup: RunCgroup | None,
    pass_fds: tuple[int, ...] = (),
) -> ProcessOutcome:
    """Run ``build_argv(status_fd)`` with `code` on stdin under `config`'s time/output limits.

    The child may write one JSON line on ``status_fd`` (what it applied; ``worker_pid``: a
    process group to kill first on a limit, so a supervisor can reap and report).
    """
    status_r, status_w = os.pipe()
    argv = _join_cgroups_then_exec(build_argv(status_w), cgroup)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            pass_fds=(status_w, *pass_fds),
            start_new_session=True,
        )
    except BaseException:
        os.close(status_r)
        os.close(status_w)
        raise
    os.close(status_w)

    def kill_everything() -> None:
        _kill_group(proc.pid)
        if cgroup is not None:
            cgroup.kill_all()

    try:
        outcome = _communicate(proc, code, status_r, config, start, kill_everything)
    finally:
        if proc.poll() is None:
            kill_everything()
        proc.wait()
        os.close(status_r)
        if cgroup is not None:
            cgroup.kill_all()
    outcome.returncode = proc.returncode
    return outcome


def _communicate(
    proc: subprocess.Popen,
    code: str,
    status_fd: int,
    config: SandboxConfig,
    start: float,
    kill_everything: Callable[[], None],
) -> ProcessOutcome:
    """Feed the code, collect capped output and enforce the wall-clock limit."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    cut = dict.fromkeys(buffers, False)
    status = bytearray()
    killed = None
    deadline = start + config.timeout_s
    with contextlib.suppress(BrokenPipeError):  # the child died during its setup
        proc.stdin.write(code.encode("utf-8", "surrogatepass"))
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.close()
    sel = selectors.DefaultSelector()
    for fd in (*buffers, status_fd):
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    worker_pid = None
    killed_at = exited_at = None

    def first_kill() -> None:
        # A supervisor (the python-audit backend) reaps the worker's tree and reports its
        # status; without one (bubblewrap) the whole tree goes at once.
        if worker_pid is not None:
            _kill_group(worker_pid)
        else:
            kill_everything()

    while sel.get_map():
        now = time.monotonic()
        if now > deadline and killed is None:
            killed = f"wall-clock timeout ({config.timeout_s:g} s)"
        if killed is not None and killed_at is None:
            killed_at = now
            first_kill()
        if proc.poll() is not None:
            exited_at = exited_at or now
        # Descendants that keep the pipes open after the top process ended, or a tree that
        # did not die from the first kill: end everything.
        if (exited_at and now - exited_at > 0.5) or (killed_at and now - killed_at > 2.0):
            kill_everything()
        for key, _ in sel.select(timeout=0.05):
            fd = key.fd
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                sel.unregister(fd)
                continue
            if fd == status_fd:
                status += chunk
                with contextlib.suppress(ValueError, IndexError, KeyError, TypeError):
                    worker_pid = int(json.loads(status.decode().splitlines()[0])["worker_pid"])
                if killed_at is not None:
                    first_kill()
                continue
            room = config.max_output_bytes - len(buffers[fd])
            buffers[fd] += chunk[: max(room, 0)]
            if len(chunk) > room and not cut[fd]:
                cut[fd] = True
                killed = killed or f"output limit ({config.max_output_bytes} bytes per stream)"
    sel.close()
    parsed: dict[str, Any] = {}
    with contextlib.suppress(ValueError, IndexError):
        parsed = json.loads(status.decode().splitlines()[0])
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    outcome = ProcessOutcome(
        stdout=bytes(buffers[out_fd]),
        stderr=bytes(buffers[err_fd]),
        stdout_cut=cut[out_fd],
        stderr_cut=cut[err_fd],
        killed=killed,
        returncode=0,
        pid=proc.pid,
        status=parsed,
    )
    proc.stdout.close()
    proc.stderr.close()
    return outcome

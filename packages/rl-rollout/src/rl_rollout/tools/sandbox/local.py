"""The ``python-audit`` backend: weak isolation, for machines without bubblewrap.

Each run is a fresh interpreter (``python -I -S -B``, a new session) in a throw-away host
directory, supervised by `bootstrap` (``supervised`` mode). Kernel-enforced: the wall clock,
the rlimits (CPU, address space, file size, open files, no core dumps), the run's cgroups
when this process may create them (else ``RLIMIT_NPROC`` where the kernel enforces it for
this user, which it does not for root), an empty network namespace when the kernel allows
one, and the output caps. Everything else (no processes, sockets, signals, file access
outside the work dir) is a Python audit hook: native code, ``_posixsubprocess`` and
``dir_fd``-relative opens get around it, and as root nothing else protects the host. It
therefore runs only with ``SandboxConfig(allow_weak_isolation=True)``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import site
import sys
import tempfile
import time
import uuid
from pathlib import Path

from rl_rollout.tools.sandbox.cgroups import RunCgroup, cgroup_support
from rl_rollout.tools.sandbox.config import SandboxConfig, SandboxResult
from rl_rollout.tools.sandbox.process import run_process, signal_reason

BOOTSTRAP = Path(__file__).with_name("bootstrap.py")
NAME = "python-audit"
_CAP_SYS_ADMIN, _CAP_SYS_RESOURCE = 21, 24


def _privileged_for_nproc() -> bool:
    """True when the kernel would not enforce RLIMIT_NPROC on us (root or the caps)."""
    if os.getuid() == 0:
        return True
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                caps = int(line.split()[1], 16)
                return bool(caps & (1 << _CAP_SYS_ADMIN | 1 << _CAP_SYS_RESOURCE))
    return False


def _tasks_of_uid(uid: int) -> int:
    """How many tasks (threads) run under `uid`: what RLIMIT_NPROC counts."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            status = Path(entry.path, "status").read_text().splitlines()
            fields = dict(line.split(":", 1) for line in status if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                total += int(fields["Threads"])
    return total


def run(code: str, config: SandboxConfig) -> SandboxResult:
    """Run `code` with the audit-hook sandbox (the caller checked allow_weak_isolation)."""
    run_id = f"rl-sandbox-{uuid.uuid4().hex[:12]}"
    work_dir = Path(tempfile.mkdtemp(prefix=f"{run_id}-", dir=config.work_dir_parent))
    isolation: list[str] = []
    cgroup = None
    support = cgroup_support()
    if support.version is not None:
        with contextlib.suppress(OSError):
            # +1: the supervisor (the shell that joined the cgroups execs it)
            cgroup = RunCgroup(
                support,
                run_id,
                config.max_processes + 1,
                (config.memory_mb + 64) * 2**20,
            )
    nproc_limit = None
    if cgroup is None and not _privileged_for_nproc():
        nproc_limit = _tasks_of_uid(os.getuid()) + config.max_processes
    child_cfg = {
        "mode": "supervised",
        "work_dir": str(work_dir),
        "allow_network": config.allow_network,
        "cpu_time_s": config.cpu_time_s,
        "memory_bytes": config.memory_mb * 2**20,
        "max_file_size_bytes": config.max_file_size_mb * 2**20,
        "max_open_files": config.max_open_files,
        "nproc_limit": nproc_limit,
        "python_guards": config.python_guards,
        "allow_subprocesses": config.allow_subprocesses,
        "extra_sys_path": list(site.getsitepackages()) if config.allow_site_packages else [],
        "read_roots": [str(Path(p).resolve()) for p in config.extra_read_paths],
    }
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(work_dir),
        "TMPDIR": str(work_dir),
        "LANG": "C.UTF-8",
        **{k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")},
    }

    def argv(status_fd: int) -> list[str]:
        cfg = json.dumps({**child_cfg, "status_fd": status_fd})
        return [sys.executable, "-I", "-S", "-B", str(BOOTSTRAP), run_id, cfg]

    start = time.monotonic()
    try:
        outcome = run_process(argv, code, config, env, str(work_dir), cgroup)
    finally:
        if cgroup is not None:
            cgroup.remove()
        shutil.rmtree(work_dir, ignore_errors=True)
    if cgroup is not None:
        isolation += cgroup.mechanisms
    isolation += outcome.status.get("applied", [])
    if nproc_limit is not None and "rlimit-nproc" not in isolation:
        isolation.append("rlimit-nproc")
    if config.python_guards:
        isolation.append("audit-hook")
    killed = outcome.killed
    if killed is None and outcome.returncode < 0:
        killed = signal_reason(-outcome.returncode, config)
    return SandboxResult(
        stdout=outcome.stdout.decode("utf-8", "replace"),
        stderr=outcome.stderr.decode("utf-8", "replace"),
        exit_code=outcome.returncode,
        killed=killed,
        duration_s=time.monotonic() - start,
        isolation=tuple(isolation),
        run_id=run_id,
        work_dir=str(work_dir),
        session_id=outcome.pid,
        stdout_truncated=outcome.stdout_cut,
        stderr_truncated=outcome.stderr_cut,
        backend=NAME,
    )

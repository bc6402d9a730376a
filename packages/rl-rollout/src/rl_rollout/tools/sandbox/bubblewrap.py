"""The ``bubblewrap`` backend: namespaces, seccomp and cgroups around a fresh interpreter.

Layers, all kernel-enforced (they hold against native code and against code that switches
the Python audit hook off):

* user namespace, uid/gid 65534 inside, all capabilities dropped (bounding set included),
  ``no_new_privs``; new mount, PID, network (unless ``allow_network``), IPC, UTS and cgroup
  namespaces; ``--die-with-parent`` and a new terminal session;
* a file system that holds only read-only binds of ``/usr`` (``/bin``, ``/lib``, ``/lib64``
  as on the host), the interpreter's prefix, this package's bootstrap, the site-packages
  when ``allow_site_packages`` and ``extra_read_paths``; ``/proc`` of the new PID namespace,
  a minimal ``/dev``; the root is read-only and ``/tmp`` (holding the work dir) is a tmpfs
  of ``disk_quota_mb``;
* the seccomp filter of `seccomp_filter` (``bwrap --seccomp FD``);
* the run's cgroups (tasks and memory) when this host allows creating them, else
  ``RLIMIT_NPROC``, which inside the new user namespace counts only the run's own tasks but
  is not enforced when the sandbox's uid maps to host root: there, without cgroups,
  ``allow_subprocesses`` is refused and seccomp's ban on process creation is the cap;
* the rlimits (CPU, address space, file size, open files, core) and the output caps.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import time
import uuid
from functools import lru_cache
from pathlib import Path

from rl_rollout.tools.sandbox.cgroups import RunCgroup, cgroup_support
from rl_rollout.tools.sandbox.config import SandboxConfig, SandboxResult
from rl_rollout.tools.sandbox.process import run_process, signal_reason
from rl_rollout.tools.sandbox.seccomp_filter import build_filter_fd, seccomp_available

logger = logging.getLogger(__name__)
BOOTSTRAP = Path(__file__).with_name("bootstrap.py")
NAME = "bubblewrap"
SANDBOX_UID = 65534
INSTALL_HINT = "install Debian's `bubblewrap` package (apt-get install bubblewrap)"


def find_bwrap(config: SandboxConfig) -> str | None:
    return shutil.which(config.bwrap_path or "bwrap")


@lru_cache(maxsize=1)
def _warn_no_cgroups(reason: str) -> None:
    logger.warning(
        "sandbox: no per-run cgroups here (%s); process creation is denied by seccomp, "
        "RLIMIT_NPROC caps it where allowed (not for host root), memory is capped by "
        "RLIMIT_AS only",
        reason,
    )


@lru_cache(maxsize=8)
def _probe(bwrap: str) -> str | None:
    """None when bwrap can create the namespaces here, else its error."""
    try:
        proc = subprocess.run(
            [
                bwrap,
                "--unshare-user",
                "--unshare-pid",
                "--unshare-net",
                "--ro-bind",
                "/usr",
                "/usr",
                *_root_links(),
                "--",
                "/usr/bin/true",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} could not run: {exc}"
    if proc.returncode != 0:
        return f"{bwrap} cannot create namespaces here: {proc.stderr.strip()}"
    return None


def unavailable_reason(config: SandboxConfig) -> str | None:
    """None when this backend can run `config` here, else why not (with what to install)."""
    bwrap = find_bwrap(config)
    if bwrap is None:
        return f"bubblewrap (`{config.bwrap_path or 'bwrap'}`) was not found: {INSTALL_HINT}"
    reason = _probe(bwrap) or seccomp_available()
    support = cgroup_support()
    if reason is None and config.allow_subprocesses and support.version is None and _root():
        reason = (
            "SandboxConfig.allow_subprocesses=True needs a kernel process cap, and there is "
            f"none here: no writable cgroup hierarchy ({support.reason}) and RLIMIT_NPROC "
            "does not apply to processes of host uid 0; delegate a cgroup or run as non-root"
        )
    return reason


def _root() -> bool:
    """Whether the sandbox's uid maps to host root (where RLIMIT_NPROC is not enforced)."""
    return os.geteuid() == 0


def _interpreter() -> tuple[str, list[str]]:
    """The real interpreter binary and the directories it needs (its prefix)."""
    executable = os.path.realpath(sys.executable)
    roots = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    if not any(stdlib.startswith(r + os.sep) for r in roots):
        roots.add(stdlib)
    return executable, sorted(roots)


def _root_links() -> list[str]:
    """/bin, /lib, /lib64, /sbin as on the host: symlinks into /usr, or read-only binds."""
    args: list[str] = []
    for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(name):
            args += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            args += ["--ro-bind", name, name]
    return args


def _bwrap_argv(
    bwrap: str, config: SandboxConfig, run_id: str, seccomp_fd: int, read_roots: list[str]
) -> list[str]:
    work_dir = f"/tmp/{run_id}"
    argv = [
        bwrap,
        "--unshare-user",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/usr",
        "/usr",
        *_root_links(),
    ]
    if not config.allow_network:
        argv.append("--unshare-net")
    argv += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(config.disk_quota_mb * 2**20),
        "--tmpfs",
        "/tmp",
        "--dir",
        work_dir,
        "--chdir",
        work_dir,
    ]
    for root in read_roots:  # after /tmp's tmpfs, which would hide binds below it
        argv += ["--ro-bind", root, root]
    argv += [
        "--remount-ro",
        "/",
        "--seccomp",
        str(seccomp_fd),
        "--",
    ]
    return argv


def run(code: str, config: SandboxConfig) -> SandboxResult:
    """Run `code` inside bubblewrap (the caller checked `unavailable_reason`)."""
    bwrap = find_bwrap(config)
    assert bwrap is not None
    run_id = f"rl-sandbox-{uuid.uuid4().hex[:12]}"
    work_dir = f"/tmp/{run_id}"
    executable, prefixes = _interpreter()
    extra_sys_path = list(site.getsitepackages()) if config.allow_site_packages else []
    read_roots = [*prefixes, str(BOOTSTRAP)]
    for path in (*extra_sys_path, *config.extra_read_paths):
        resolved = os.path.realpath(path)
        if not os.path.exists(resolved):
            if path in config.extra_read_paths:
                raise ValueError(
                    f"SandboxConfig.extra_read_paths contains {path!r}, which does not exist: "
                    "expected existing files or directories"
                )
            continue
        read_roots.append(resolved)
    child_cfg = {
        "mode": "direct",
        "work_dir": work_dir,
        "allow_network": config.allow_network,
        "cpu_time_s": config.cpu_time_s,
        "memory_bytes": config.memory_mb * 2**20,
        "max_file_size_bytes": config.max_file_size_mb * 2**20,
        "max_open_files": config.max_open_files,
        # Counted per (user namespace, uid): the bwrap PID 1 reaper plus the code's tasks.
        "nproc_limit": config.max_processes + 1,
        "python_guards": config.python_guards,
        "allow_subprocesses": config.allow_subprocesses,
        "extra_sys_path": extra_sys_path,
        "read_roots": [os.path.realpath(p) for p in config.extra_read_paths],
    }
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": work_dir,
        "TMPDIR": work_dir,
        "LANG": "C.UTF-8",
        **{k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")},
    }
    support = cgroup_support()
    cgroup = None
    isolation: list[str] = ["userns", "mountns", "pidns", "ipcns", "utsns"]
    if not config.allow_network:
        isolation.append("netns")
    isolation += [f"tmpfs-quota-{config.disk_quota_mb}MiB", "ro-root"]
    if support.version is not None:
        # +2: bubblewrap's outer process and its PID 1 reaper; memory: the code's limit,
        # the tmpfs (its pages are charged to the writer) and bubblewrap itself.
        memory = (config.memory_mb + config.disk_quota_mb + 32) * 2**20
        cgroup = RunCgroup(support, run_id, config.max_processes + 2, memory)
        isolation += cgroup.mechanisms
    seccomp_fd = build_filter_fd(config.allow_subprocesses)
    if config.allow_subprocesses:
        isolation.append("subprocesses-allowed")

    def argv(status_fd: int) -> list[str]:
        cfg = json.dumps({**child_cfg, "status_fd": status_fd})
        head = _bwrap_argv(bwrap, config, run_id, seccomp_fd, read_roots)
        return [*head, executable, "-I", "-S", "-B", str(BOOTSTRAP), run_id, cfg]

    start = time.monotonic()
    try:
        outcome = run_process(argv, code, config, env, None, cgroup, pass_fds=(seccomp_fd,))
        oom = cgroup is not None and cgroup.oom_killed()
    finally:
        os.close(seccomp_fd)
        if cgroup is not None:
            cgroup.remove()
    applied = outcome.status.get("applied", [])
    # RLIMIT_NPROC is set either way, but the kernel ignores it for host uid 0
    isolation += [m for m in applied if not (m == "rlimit-nproc" and _root())]
    if support.version is None:
        _warn_no_cgroups(support.reason)
        if not _root():
            isolation.append("rlimit-nproc-userns")
    if config.python_guards:
        isolation.append("audit-hook")
    exit_code = outcome.returncode
    killed = outcome.killed
    # bubblewrap reports a signalled child as 128 + signal
    if exit_code > 128 and exit_code - 128 < 65:
        exit_code = -(exit_code - 128)
    if killed is None and exit_code < 0:
        killed = signal_reason(-exit_code, config)
        if oom:
            killed = f"memory limit ({config.memory_mb} MiB, cgroup)"
    return SandboxResult(
        stdout=outcome.stdout.decode("utf-8", "replace"),
        stderr=outcome.stderr.decode("utf-8", "replace"),
        exit_code=exit_code,
        killed=killed,
        duration_s=time.monotonic() - start,
        isolation=tuple(dict.fromkeys(isolation)),
        run_id=run_id,
        work_dir=work_dir,
        session_id=outcome.pid,
        stdout_truncated=outcome.stdout_cut,
        stderr_truncated=outcome.stderr_cut,
        backend=NAME,
    )

"""Sandboxed Python execution: the ``python`` tool.

Each call runs the code in a fresh interpreter (``python -I -S -B``, a new session) inside a
throw-away working directory that is deleted afterwards. What is enforced, and by whom:

Kernel-enforced (hold against any code, native code included):
  * wall-clock timeout (the parent kills the whole process tree) and ``RLIMIT_CPU``;
  * ``RLIMIT_AS`` (memory), ``RLIMIT_FSIZE`` (largest file written), ``RLIMIT_NOFILE``,
    no core dumps;
  * process count: a pids cgroup (``pids.max``) when this process may create one (root, or a
    delegated cgroup), else ``RLIMIT_NPROC`` when the kernel enforces it for this user (not
    for root); the cgroup also lets the parent kill every descendant at the end;
  * network: a new, empty network namespace (``unshare(CLONE_NEWNET)``; as non-root inside a
    new user namespace) when the kernel permits it;
  * output size: the parent reads at most ``max_output_bytes`` per stream and kills the
    process tree when a stream exceeds it.
Python-level (an audit hook; native code could bypass it, so ctypes is refused too):
  * no process creation (fork/exec/spawn/subprocess/system), no sockets, no signals to
    other processes, no hard links;
  * file writes only inside the working directory; reads only inside it, the interpreter's
    library directories, ``extra_read_paths`` and a few devices (/dev/null, /dev/urandom).
    When running as root these audit-hook rules are what protects files outside the work
    directory; as an unprivileged user normal file permissions apply as well.

`SandboxResult.isolation` lists the mechanisms that were actually in force for a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import selectors
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rl_rollout.tools.base import Tool, ToolResult, ToolSchema

__all__ = ["PythonSandboxTool", "SandboxConfig", "SandboxResult", "run_python"]

BOOTSTRAP = Path(__file__).with_name("sandbox_bootstrap.py")
_CAP_SYS_ADMIN, _CAP_SYS_RESOURCE = 21, 24


@dataclass
class SandboxConfig:
    """Limits of one sandboxed run (sizes in bytes/MiB as named)."""

    timeout_s: float = 10.0
    cpu_time_s: int = 10
    memory_mb: int = 512
    max_processes: int = 8
    max_file_size_mb: int = 16
    max_open_files: int = 64
    max_output_bytes: int = 64 * 1024
    allow_network: bool = False
    allow_site_packages: bool = False
    extra_read_paths: tuple[str, ...] = ()
    python_guards: bool = True
    work_dir_parent: str | None = None

    def validate(self) -> SandboxConfig:
        def bad(name: str, expected: str) -> ValueError:
            return ValueError(
                f"SandboxConfig.{name}={getattr(self, name)!r} is invalid: expected {expected}"
            )

        if not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            raise bad("timeout_s", "a number of seconds > 0")
        for name, minimum in (
            ("cpu_time_s", 1),
            ("memory_mb", 32),
            ("max_processes", 1),
            ("max_file_size_mb", 0),
            ("max_open_files", 16),
            ("max_output_bytes", 1),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise bad(name, f"an integer >= {minimum}")
        return self


@dataclass
class SandboxResult:
    """Outcome of one run. ``killed`` names the limit that stopped it (None: it exited)."""

    stdout: str
    stderr: str
    exit_code: int | None
    killed: str | None
    duration_s: float
    isolation: tuple[str, ...]
    run_id: str
    work_dir: str
    session_id: int
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.killed is None and self.exit_code == 0

    def to_text(self) -> str:
        """The result as the tool message the model reads."""
        parts = []
        if self.killed:
            parts.append(f"killed: {self.killed}")
        parts.append(f"exit status: {self.exit_code}")
        for name, text, cut in (
            ("stdout", self.stdout, self.stdout_truncated),
            ("stderr", self.stderr, self.stderr_truncated),
        ):
            if text or cut:
                parts.append(f"{name}:\n{text}" + ("\n[output truncated]" if cut else ""))
        return "\n".join(parts)


# ---------------------------------------------------------------------------------------
# process-count limit: a pids cgroup (v1 or v2) when we may create one
# ---------------------------------------------------------------------------------------


def _own_pids_cgroup_dir() -> Path | None:
    """The directory under which this process can create pids cgroups, if any."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    v1_mount = v2_mount = None
    for line in mounts:
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup" and "pids" in fields[3].split(","):
            v1_mount = fields[1]
        elif len(fields) >= 3 and fields[2] == "cgroup2":
            v2_mount = fields[1]
    for line in own:
        hierarchy, controllers, path = line.split(":", 2)
        if v1_mount and "pids" in controllers.split(","):
            candidate = Path(v1_mount) / path.lstrip("/")
            if os.access(candidate, os.W_OK):
                return candidate
        if v2_mount and hierarchy == "0":
            candidate = Path(v2_mount) / path.lstrip("/")
            with contextlib.suppress(OSError):
                enabled = (candidate / "cgroup.subtree_control").read_text().split()
                if "pids" in enabled and os.access(candidate, os.W_OK):
                    return candidate
    return None


class _PidsCgroup:
    """A throw-away pids cgroup: caps the process count and kills every member at the end."""

    def __init__(self, parent: Path, name: str, max_pids: int) -> None:
        self.path = parent / name
        self.path.mkdir()
        (self.path / "pids.max").write_text(str(max_pids))

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        with contextlib.suppress(OSError):
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        return []

    def kill_all(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                self.kill_all(0.1)
                time.sleep(0.02)


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


# ---------------------------------------------------------------------------------------
# running code
# ---------------------------------------------------------------------------------------


def _kill_worker(worker_pid: int | None) -> None:
    """End the worker's process group; the supervisor then reaps every descendant."""
    if worker_pid is not None:
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(worker_pid, signal.SIGKILL)


def _kill_all(proc: subprocess.Popen, cgroup: _PidsCgroup | None, worker_pid: int | None) -> None:
    """Last resort: kill the supervisor's session, the worker's group and the cgroup."""
    _kill_worker(worker_pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if cgroup is not None:
        cgroup.kill_all()


def _signal_reason(returncode: int, config: SandboxConfig) -> str | None:
    if returncode >= 0:
        return None
    sig = -returncode
    if sig == signal.SIGXCPU:
        return f"cpu time limit ({config.cpu_time_s} s)"
    if sig == signal.SIGXFSZ:
        return f"file size limit ({config.max_file_size_mb} MiB)"
    if sig == signal.SIGKILL:
        return "killed by SIGKILL (cpu hard limit or out of memory)"
    return f"terminated by signal {signal.Signals(sig).name}"


def run_python(code: str, config: SandboxConfig | None = None) -> SandboxResult:
    """Run `code` in the sandbox and return its output; never raises for the code's faults."""
    config = (config or SandboxConfig()).validate()
    if not isinstance(code, str):
        raise TypeError(f"code is a {type(code).__name__}: expected str")
    run_id = f"rl-sandbox-{uuid.uuid4().hex[:12]}"
    work_dir = Path(tempfile.mkdtemp(prefix=f"{run_id}-", dir=config.work_dir_parent))
    isolation: list[str] = []
    cgroup = None
    cgroup_parent = _own_pids_cgroup_dir()
    if cgroup_parent is not None:
        with contextlib.suppress(OSError):
            # +1: the supervisor process that reaps the run's descendants
            cgroup = _PidsCgroup(cgroup_parent, run_id, config.max_processes + 1)
    nproc_limit = None
    if cgroup is None and not _privileged_for_nproc():
        nproc_limit = _tasks_of_uid(os.getuid()) + config.max_processes
    extra_path = list(site.getsitepackages()) if config.allow_site_packages else []
    status_r, status_w = os.pipe()
    child_cfg = {
        "status_fd": status_w,
        "work_dir": str(work_dir),
        "allow_network": config.allow_network,
        "cpu_time_s": config.cpu_time_s,
        "memory_bytes": config.memory_mb * 2**20,
        "max_file_size_bytes": config.max_file_size_mb * 2**20,
        "max_open_files": config.max_open_files,
        "nproc_limit": nproc_limit,
        "python_guards": config.python_guards,
        "extra_sys_path": extra_path,
        "read_roots": [str(Path(p).resolve()) for p in config.extra_read_paths],
    }
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(work_dir),
        "TMPDIR": str(work_dir),
        "LANG": "C.UTF-8",
        **{k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")},
    }
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", str(BOOTSTRAP), run_id, json.dumps(child_cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=work_dir,
            env=env,
            pass_fds=(status_w,),
            start_new_session=True,
        )
    except BaseException:
        os.close(status_r)
        os.close(status_w)
        shutil.rmtree(work_dir, ignore_errors=True)
        if cgroup is not None:
            cgroup.remove()
        raise
    os.close(status_w)
    try:
        if cgroup is not None:
            cgroup.add(proc.pid)
            isolation.append("cgroup-pids")
        result = _communicate(proc, code, status_r, config, cgroup, start)
    finally:
        if proc.poll() is None:
            _kill_all(proc, cgroup, None)
        proc.wait()
        os.close(status_r)
        if cgroup is not None:
            cgroup.remove()
        shutil.rmtree(work_dir, ignore_errors=True)
    stdout, stderr, out_cut, err_cut, killed, applied = result
    isolation += applied
    if nproc_limit is not None and "rlimit-nproc" not in isolation:
        isolation.append("rlimit-nproc")
    if config.python_guards:
        isolation.append("audit-hook")
    killed = killed or _signal_reason(proc.returncode, config)
    return SandboxResult(
        stdout=stdout.decode("utf-8", "replace"),
        stderr=stderr.decode("utf-8", "replace"),
        exit_code=proc.returncode,
        killed=killed,
        duration_s=time.monotonic() - start,
        isolation=tuple(isolation),
        run_id=run_id,
        work_dir=str(work_dir),
        session_id=proc.pid,
        stdout_truncated=out_cut,
        stderr_truncated=err_cut,
    )


def _communicate(
    proc: subprocess.Popen,
    code: str,
    status_fd: int,
    config: SandboxConfig,
    cgroup: _PidsCgroup | None,
    start: float,
) -> tuple[bytes, bytes, bool, bool, str | None, list[str]]:
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
    while sel.get_map():
        now = time.monotonic()
        if now > deadline and killed is None:
            killed = f"wall-clock timeout ({config.timeout_s:g} s)"
        if killed is not None and killed_at is None:
            killed_at = now
            _kill_worker(worker_pid)
        # The supervisor reaps the worker's descendants and exits; if it does not (or
        # descendants escaped it and keep the pipes open), end everything.
        if proc.poll() is not None:
            exited_at = exited_at or now
        if (exited_at and now - exited_at > 0.5) or (killed_at and now - killed_at > 2.0):
            _kill_all(proc, cgroup, worker_pid)
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
                with contextlib.suppress(ValueError, IndexError, KeyError):
                    worker_pid = int(json.loads(status.decode().splitlines()[0])["worker_pid"])
                if killed_at is not None:
                    _kill_worker(worker_pid)
                continue
            room = config.max_output_bytes - len(buffers[fd])
            buffers[fd] += chunk[: max(room, 0)]
            if len(chunk) > room and not cut[fd]:
                cut[fd] = True
                killed = killed or f"output limit ({config.max_output_bytes} bytes per stream)"
    sel.close()
    applied: list[str] = []
    with contextlib.suppress(ValueError, IndexError):
        applied = json.loads(status.decode().splitlines()[0])["applied"]
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    result = bytes(buffers[out_fd]), bytes(buffers[err_fd]), cut[out_fd], cut[err_fd]
    proc.stdout.close()
    proc.stderr.close()
    return (*result, killed, applied)


# ---------------------------------------------------------------------------------------
# the tool
# ---------------------------------------------------------------------------------------

PYTHON_TOOL_SCHEMA = ToolSchema(
    name="python",
    description=(
        "Run a Python program in a fresh sandboxed interpreter and return its stdout, stderr "
        "and exit status. Print what you want to see. No network, no subprocesses, limited "
        "time and memory; files can be written only in the current directory."
    ),
    parameters={
        "type": "object",
        "properties": {"code": {"type": "string", "description": "The Python program to run."}},
        "required": ["code"],
        "additionalProperties": False,
    },
)


class PythonSandboxTool(Tool):
    """The ``python`` tool: runs the model's code with `run_python` under `config`'s limits.

    At most ``max_concurrency`` sandboxes run at a time (each is a process).
    """

    schema = PYTHON_TOOL_SCHEMA

    def __init__(
        self,
        config: SandboxConfig | dict[str, Any] | None = None,
        max_concurrency: int = 4,
        schema: ToolSchema | dict[str, Any] | None = None,
    ) -> None:
        super().__init__(schema)
        self.config = (
            config if isinstance(config, SandboxConfig) else SandboxConfig(**(config or {}))
        ).validate()
        if not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(
                f"PythonSandboxTool.max_concurrency={max_concurrency!r} is invalid: "
                "expected an integer >= 1"
            )
        self.max_concurrency = max_concurrency
        self._semaphores: dict[int, asyncio.Semaphore] = {}

    def _semaphore(self) -> asyncio.Semaphore:
        # One semaphore per event loop: the tool may be shared by several loops (threads).
        loop_id = id(asyncio.get_running_loop())
        if loop_id not in self._semaphores:
            self._semaphores[loop_id] = asyncio.Semaphore(self.max_concurrency)
        return self._semaphores[loop_id]

    async def execute(self, arguments: dict[str, Any]) -> ToolResult:
        async with self._semaphore():
            result = await asyncio.to_thread(run_python, arguments["code"], self.config)
        metrics = {
            "sandbox/duration_s": result.duration_s,
            "sandbox/killed": float(bool(result.killed)),
        }
        return ToolResult(text=result.to_text(), is_error=not result.ok, metrics=metrics)


def sandbox_report(config: SandboxConfig | None = None) -> dict[str, Any]:
    """Which mechanisms a run would use on this machine (for logs and docs)."""
    result = run_python("pass", config)
    return {"isolation": list(result.isolation), "config": asdict(config or SandboxConfig())}

"""Per-run cgroups: a process (task) cap and a memory cap that the sandboxed code cannot leave.

cgroup v2 (``pids.max``, ``memory.max``, ``memory.swap.max``, ``cgroup.kill``) where this
process may create child cgroups with those controllers enabled; otherwise the v1 ``pids``
and ``memory`` hierarchies (``pids.max``, ``memory.limit_in_bytes``) where they are
writable. `cgroup_support()` says which and, when neither is usable, why.

The run is placed in its cgroups *before* its first instruction (a shell writes its own pid
into ``cgroup.procs`` and then execs the sandbox), so every process it creates is counted.
Inside bubblewrap the code cannot leave them: it has no cgroup file system (no /sys), a new
cgroup namespace, no capabilities, and mount is refused by seccomp.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class CgroupSupport:
    """Where run cgroups can be created: ``{"pids": dir, "memory": dir}``; ``reason`` if not."""

    version: str | None
    parents: dict[str, Path] = field(default_factory=dict)
    reason: str = ""


def _mounts() -> list[list[str]]:
    try:
        return [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return []


def _own_cgroups() -> list[tuple[str, list[str], str]]:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        out.append((hierarchy, controllers.split(",") if controllers else [], path))
    return out


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


@lru_cache(maxsize=1)
def cgroup_support() -> CgroupSupport:
    """Detect (once) which cgroup version this process can use for per-run limits."""
    mounts, own = _mounts(), _own_cgroups()
    v2_mount = next((m[1] for m in mounts if len(m) > 2 and m[2] == "cgroup2"), None)
    reasons = []
    if v2_mount:
        for hierarchy, _, path in own:
            if hierarchy != "0":
                continue
            base = Path(v2_mount) / path.lstrip("/")
            try:
                enabled = (base / "cgroup.subtree_control").read_text().split()
            except OSError as exc:
                reasons.append(f"cgroup v2 at {base}: {exc.strerror}")
                continue
            missing = {"pids", "memory"} - set(enabled)
            if missing:
                reasons.append(
                    f"cgroup v2 at {base} does not delegate {', '.join(sorted(missing))}"
                )
            elif not _writable_dir(base):
                reasons.append(f"cgroup v2 at {base} is not writable")
            else:
                return CgroupSupport("v2", {"pids": base, "memory": base})
    else:
        reasons.append("no cgroup v2 file system is mounted")
    parents: dict[str, Path] = {}
    for controller in ("pids", "memory"):
        mount = next(
            (
                m[1]
                for m in mounts
                if len(m) > 3 and m[2] == "cgroup" and controller in m[3].split(",")
            ),
            None,
        )
        path = next((p for _, ctrls, p in own if controller in ctrls), None)
        if mount is None or path is None:
            reasons.append(f"no cgroup v1 {controller} hierarchy")
            continue
        base = Path(mount) / path.lstrip("/")
        if _writable_dir(base):
            parents[controller] = base
        else:
            reasons.append(f"cgroup v1 {controller} at {base} is not writable")
    if len(parents) == 2:
        return CgroupSupport("v1", parents)
    return CgroupSupport(None, {}, "; ".join(reasons))


class RunCgroup:
    """The cgroups of one run: caps tasks and memory, kills every member at the end."""

    def __init__(self, support: CgroupSupport, name: str, max_tasks: int, memory_bytes: int):
        assert support.version is not None
        self.version = support.version
        self.dirs: list[Path] = []
        try:
            if self.version == "v2":
                path = support.parents["pids"] / name
                path.mkdir()
                self.dirs.append(path)
                (path / "pids.max").write_text(str(max_tasks))
                (path / "memory.max").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (path / "memory.swap.max").write_text("0")
            else:
                pids = support.parents["pids"] / name
                pids.mkdir()
                self.dirs.append(pids)
                (pids / "pids.max").write_text(str(max_tasks))
                memory = support.parents["memory"] / name
                memory.mkdir()
                self.dirs.append(memory)
                (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
        except BaseException:
            self.remove()
            raise

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a new process writes its pid into to join."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    @property
    def mechanisms(self) -> list[str]:
        return [f"cgroup-{self.version}-pids", f"cgroup-{self.version}-memory"]

    def pids(self) -> list[int]:
        found: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return sorted(found)

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer ended a member for the memory cap."""
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                if self.version == "v2":
                    events = dict(
                        line.split() for line in (d / "memory.events").read_text().splitlines()
                    )
                    return int(events.get("oom_kill", 0)) > 0
                if (d / "memory.oom_control").exists():
                    for line in (d / "memory.oom_control").read_text().splitlines():
                        if line.startswith("oom_kill "):
                            return int(line.split()[1]) > 0
        return False

    def kill_all(self, timeout_s: float = 5.0) -> None:
        if self.version == "v2":
            with contextlib.suppress(OSError):
                (self.dirs[0] / "cgroup.kill").write_text("1")
        deadline = time.monotonic() + timeout_s
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self, timeout_s: float = 5.0) -> None:
        for d in reversed(self.dirs):
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    self.kill_all(0.1)
                    time.sleep(0.02)

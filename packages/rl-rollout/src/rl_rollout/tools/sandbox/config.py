"""Configuration and result types shared by every sandbox backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rl_core.config import check, validate

BACKENDS = ("auto", "bubblewrap", "remote", "python-audit")


class SandboxUnavailableError(RuntimeError):
    """No backend that meets the configured isolation can run on this machine."""


@dataclass
class SandboxConfig:
    """Limits and isolation of one sandboxed run (sizes in bytes/MiB as named).

    ``backend``: ``"auto"`` picks the strongest available one (bubblewrap, then ``remote``
    when ``remote_url`` is set); ``"python-audit"`` (a Python audit hook only, bypassable by
    native code) runs only with ``allow_weak_isolation=True``.
    """

    timeout_s: float = 10.0
    cpu_time_s: int = 10
    memory_mb: int = 512
    max_processes: int = 8
    max_file_size_mb: int = 16
    max_open_files: int = 64
    max_output_bytes: int = 64 * 1024
    disk_quota_mb: int = 64
    allow_network: bool = False
    allow_subprocesses: bool = False
    allow_site_packages: bool = False
    extra_read_paths: tuple[str, ...] = ()
    python_guards: bool = True
    work_dir_parent: str | None = None  # python-audit only; bubblewrap uses its own tmpfs
    backend: Literal["auto", "bubblewrap", "remote", "python-audit"] = "auto"
    allow_weak_isolation: bool = False
    remote_url: str | None = None
    bwrap_path: str | None = None

    def check(self) -> None:
        check(self.timeout_s > 0, "timeout_s", self.timeout_s, "a number of seconds > 0")
        for name, minimum in (
            ("cpu_time_s", 1),
            ("memory_mb", 32),
            ("max_processes", 1),
            ("max_file_size_mb", 0),
            ("max_open_files", 16),
            ("max_output_bytes", 1),
            ("disk_quota_mb", 1),
        ):
            value = getattr(self, name)
            check(value >= minimum, name, value, f"an integer >= {minimum}")
        check(self.backend != "remote" or bool(self.remote_url), "remote_url", self.remote_url,
              "an http(s) URL of a SandboxFusion service for backend=remote")  # fmt: skip
        check(self.remote_url is None or self.remote_url.startswith(("http://", "https://")),
              "remote_url", self.remote_url, "an http:// or https:// URL")  # fmt: skip

    def validate(self) -> SandboxConfig:
        """Check every field (`rl_core.config`); errors name ``SandboxConfig.<field>``."""
        return validate(self, "SandboxConfig")


@dataclass
class SandboxResult:
    """Outcome of one run. ``killed`` names the limit that stopped it (None: it exited).

    ``backend`` is the backend that ran the code; ``isolation`` lists the mechanisms that
    were in force (verified inside the sandbox where the backend can check them).
    """

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
    backend: str = ""

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

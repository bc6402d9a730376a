"""Configuration and result types shared by every sandbox backend."""

from __future__ import annotations

from dataclasses import dataclass

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
    backend: str = "auto"
    allow_weak_isolation: bool = False
    remote_url: str | None = None
    bwrap_path: str | None = None

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
            ("disk_quota_mb", 1),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise bad(name, f"an integer >= {minimum}")
        if self.backend not in BACKENDS:
            raise bad("backend", f"one of {', '.join(BACKENDS)}")
        if self.backend == "remote" and not self.remote_url:
            raise bad("remote_url", "an http(s) URL of a SandboxFusion service for backend=remote")
        if self.remote_url is not None and not str(self.remote_url).startswith(
            ("http://", "https://")
        ):
            raise bad("remote_url", "an http:// or https:// URL")
        if isinstance(self.extra_read_paths, str):
            raise bad("extra_read_paths", "a tuple of paths, not one string")
        return self


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

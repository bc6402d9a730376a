"""Choose a sandbox backend and run code in it (`rl_rollout.tools.sandbox` re-exports
these; the ``python`` tool calls them)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rl_rollout.tools.sandbox import bubblewrap, local, remote
from rl_rollout.tools.sandbox.cgroups import cgroup_support
from rl_rollout.tools.sandbox.config import SandboxConfig, SandboxResult, SandboxUnavailableError

__all__ = ["run_python", "sandbox_report", "select_backend"]

_WEAK = (
    "the python-audit backend is a Python audit hook that native code gets around; set "
    "SandboxConfig.allow_weak_isolation=True to accept it for trusted code"
)


def select_backend(config: SandboxConfig) -> str:
    """The backend `config` runs under here; `SandboxUnavailableError` if none may run."""
    config.validate()
    if config.backend == "remote" or (config.backend == "auto" and config.remote_url):
        return remote.NAME
    if config.backend in ("auto", bubblewrap.NAME):
        reason = bubblewrap.unavailable_reason(config)
        if reason is None:
            return bubblewrap.NAME
        if config.backend == bubblewrap.NAME or not config.allow_weak_isolation:
            raise SandboxUnavailableError(
                f"no strong sandbox backend is available: {reason}. Or set "
                "SandboxConfig.remote_url to a SandboxFusion service; "
                f"{_WEAK if config.backend == 'auto' else ''}".rstrip("; ")
            )
        return local.NAME
    if not config.allow_weak_isolation:
        raise SandboxUnavailableError(
            f"SandboxConfig.backend='python-audit' refuses untrusted code: {_WEAK}; for "
            f"strong isolation {bubblewrap.INSTALL_HINT}"
        )
    return local.NAME


def run_python(code: str, config: SandboxConfig | None = None) -> SandboxResult:
    """Run `code` in the sandbox and return its output; never raises for the code's faults.

    Raises `SandboxUnavailableError` when no backend that `config` accepts can run here.
    """
    config = (config or SandboxConfig()).validate()
    if not isinstance(code, str):
        raise TypeError(f"code is a {type(code).__name__}: expected str")
    backend = select_backend(config)
    if backend == bubblewrap.NAME:
        return bubblewrap.run(code, config)
    if backend == remote.NAME:
        return remote.run(code, config)
    return local.run(code, config)


def sandbox_report(config: SandboxConfig | None = None) -> dict[str, Any]:
    """Which backend and mechanisms a run would use on this machine (for logs and docs)."""
    result = run_python("pass", config)
    support = cgroup_support()
    return {
        "backend": result.backend,
        "cgroups": support.version or f"unavailable: {support.reason}",
        "isolation": list(result.isolation),
        "config": asdict(config or SandboxConfig()),
    }

"""Sandboxed Python execution: the ``python`` tool and its backends.

`run_python(code, config=None)` runs `code` in the strongest backend available (or the one
``config.backend`` names) and returns a `SandboxResult` that names the backend in force and
the isolation mechanisms it applied:

* ``bubblewrap`` (`bubblewrap`): user/mount/PID/network/IPC/UTS namespaces, read-only
  interpreter, tmpfs work dir with a quota, no_new_privs, no capabilities, seccomp, cgroups
  or a per-namespace RLIMIT_NPROC, rlimits, output caps. Holds against native code.
* ``remote`` (`remote`): a SandboxFusion service (``POST /run_code``); isolation is the
  service's.
* ``python-audit`` (`local`): a Python audit hook plus rlimits; native code gets around it,
  so it runs only with ``allow_weak_isolation=True``.

With no strong backend, the default config raises `SandboxUnavailableError` naming what to
install. `rl_rollout.tools.sandbox.service` serves this sandbox over the SandboxFusion API.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rl_rollout.tools.sandbox import bubblewrap, local, remote
from rl_rollout.tools.sandbox.config import (
    BACKENDS,
    SandboxConfig,
    SandboxResult,
    SandboxUnavailableError,
)
from rl_rollout.tools.sandbox.tool import PYTHON_TOOL_SCHEMA, PythonSandboxTool

__all__ = [
    "BACKENDS",
    "PYTHON_TOOL_SCHEMA",
    "PythonSandboxTool",
    "SandboxConfig",
    "SandboxResult",
    "SandboxUnavailableError",
    "run_python",
    "sandbox_report",
    "select_backend",
]

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
    from rl_rollout.tools.sandbox.cgroups import cgroup_support

    result = run_python("pass", config)
    support = cgroup_support()
    return {
        "backend": result.backend,
        "cgroups": support.version or f"unavailable: {support.reason}",
        "isolation": list(result.isolation),
        "config": asdict(config or SandboxConfig()),
    }

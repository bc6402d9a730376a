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

from rl_rollout.tools.sandbox.config import (
    BACKENDS,
    SandboxConfig,
    SandboxResult,
    SandboxUnavailableError,
)
from rl_rollout.tools.sandbox.run import run_python, sandbox_report, select_backend
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

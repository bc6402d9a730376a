"""The ``remote`` backend: a SandboxFusion service (``POST {remote_url}/run_code``).

Request: ``{"code", "language": "python", "run_timeout", "compile_timeout",
"memory_limit_MB", "stdin": "", "files": {}, "fetch_files": []}``. Response: ``{"status":
"Success" | "Failed" | "SandboxError", "message", "compile_result", "run_result": {"status":
"Finished" | "TimeLimitExceeded" | "Error", "execution_time", "return_code", "stdout",
"stderr"}, "files"}``. The isolation is the service's; `rl_rollout.tools.sandbox.service`
reports its backend under the extra key ``"rl_sandbox"``, which is added to the result.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

from rl_rollout.tools.sandbox.config import SandboxConfig, SandboxResult

NAME = "remote"
NETWORK_SLACK_S = 30.0


class SandboxServiceError(RuntimeError):
    """The remote sandbox service failed (not the code): unreachable, bad reply, its error."""


def _cap(text: str, limit: int) -> tuple[str, bool]:
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text, False
    return data[:limit].decode("utf-8", "ignore"), True


def request_body(code: str, config: SandboxConfig) -> dict[str, Any]:
    return {
        "code": code,
        "language": "python",
        "run_timeout": config.timeout_s,
        "compile_timeout": config.timeout_s,
        "memory_limit_MB": config.memory_mb,
        "stdin": "",
        "files": {},
        "fetch_files": [],
    }


def run(code: str, config: SandboxConfig) -> SandboxResult:
    """Run `code` on the service at ``config.remote_url``; raises `SandboxServiceError`."""
    url = str(config.remote_url).rstrip("/") + "/run_code"
    body = json.dumps(request_body(code, config)).encode()
    req = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    start = time.monotonic()
    timeout = config.timeout_s + NETWORK_SLACK_S
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            reply = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:500].decode("utf-8", "replace")
        raise SandboxServiceError(
            f"sandbox service {url} answered HTTP {exc.code}: {detail}"
        ) from exc
    except (OSError, ValueError) as exc:  # URLError, time-out, bad JSON
        raise SandboxServiceError(
            f"sandbox service {url} failed within {timeout:g} s: {exc}"
        ) from exc
    run_result = reply.get("run_result") if isinstance(reply, dict) else None
    if reply.get("status") == "SandboxError" or not isinstance(run_result, dict):
        raise SandboxServiceError(
            f"sandbox service {url} could not run the code: status={reply.get('status')!r} "
            f"message={reply.get('message')!r}"
        )
    extra = reply.get("rl_sandbox") if isinstance(reply.get("rl_sandbox"), dict) else {}
    killed = extra.get("killed")
    if killed is None and run_result.get("status") == "TimeLimitExceeded":
        killed = f"wall-clock timeout ({config.timeout_s:g} s)"
    stdout, out_cut = _cap(str(run_result.get("stdout") or ""), config.max_output_bytes)
    stderr, err_cut = _cap(str(run_result.get("stderr") or ""), config.max_output_bytes)
    if (out_cut or err_cut) and killed is None:
        killed = f"output limit ({config.max_output_bytes} bytes per stream)"
    isolation = ["remote-sandboxfusion"]
    if extra.get("backend"):
        isolation += [f"service:{extra['backend']}", *map(str, extra.get("isolation", []))]
    return_code = run_result.get("return_code")
    return SandboxResult(
        stdout=stdout,
        stderr=stderr,
        exit_code=return_code if isinstance(return_code, int) else None,
        killed=killed,
        duration_s=time.monotonic() - start,
        isolation=tuple(isolation),
        run_id=f"rl-sandbox-{uuid.uuid4().hex[:12]}",
        work_dir="",
        session_id=-1,
        stdout_truncated=out_cut or bool(extra.get("stdout_truncated")),
        stderr_truncated=err_cut or bool(extra.get("stderr_truncated")),
        backend=NAME,
    )

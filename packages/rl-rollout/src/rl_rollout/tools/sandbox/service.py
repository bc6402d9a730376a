"""A SandboxFusion-compatible service (``POST /run_code``) that runs Python through
`run_python`, for clusters whose workers lack bubblewrap: run it where bubblewrap is
installed and point ``SandboxConfig.remote_url`` at it.

    python -m rl_rollout.tools.sandbox.service --host 127.0.0.1 --port 8080

Only ``language="python"`` with empty ``stdin``, ``files`` and ``fetch_files`` is accepted;
anything else is refused with HTTP 400 and a message naming the field. The reply carries
the backend in force under the extra key ``"rl_sandbox"``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rl_rollout.tools.sandbox.config import SandboxConfig

MAX_BODY_BYTES = 16 * 2**20


class RequestError(ValueError):
    """A request field is missing or has a value this service does not support."""


def _config_for(request: Any, base: SandboxConfig) -> tuple[str, SandboxConfig]:
    if not isinstance(request, dict):
        raise RequestError("the body must be a JSON object")
    code = request.get("code")
    if not isinstance(code, str):
        raise RequestError(f"code={code!r} is invalid: expected a string")
    language = request.get("language", "python")
    if language != "python":
        raise RequestError(f"language={language!r} is not supported: expected 'python'")
    for name, empty in (("stdin", ""), ("files", {}), ("fetch_files", [])):
        if request.get(name) not in (None, empty):
            raise RequestError(f"{name} is not supported by this service: expected {empty!r}")
    changes: dict[str, Any] = {}
    timeout = request.get("run_timeout")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise RequestError(f"run_timeout={timeout!r} is invalid: expected seconds > 0")
        changes["timeout_s"] = min(float(timeout), base.timeout_s)
    memory = request.get("memory_limit_MB")
    if memory not in (None, -1):
        if isinstance(memory, bool) or not isinstance(memory, int) or memory < 32:
            raise RequestError(f"memory_limit_MB={memory!r} is invalid: expected -1 or >= 32")
        changes["memory_mb"] = min(memory, base.memory_mb)
    return code, dataclasses.replace(base, **changes)


def handle_run_code(request: Any, base: SandboxConfig) -> dict[str, Any]:
    """The SandboxFusion reply for one ``/run_code`` request (raises `RequestError`)."""
    from rl_rollout.tools.sandbox import run_python

    code, config = _config_for(request, base)
    result = run_python(code, config)
    if result.killed and result.killed.startswith("wall-clock timeout"):
        status = "TimeLimitExceeded"
    elif result.killed:
        status = "Error"
    else:
        status = "Finished"
    return {
        "status": "Success" if result.ok else "Failed",
        "message": result.killed or "",
        "compile_result": None,
        "run_result": {
            "status": status,
            "execution_time": result.duration_s,
            "return_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
        },
        "files": {},
        "rl_sandbox": {
            "backend": result.backend,
            "isolation": list(result.isolation),
            "killed": result.killed,
            "stdout_truncated": result.stdout_truncated,
            "stderr_truncated": result.stderr_truncated,
        },
    }


def make_server(host: str, port: int, config: SandboxConfig | None = None) -> ThreadingHTTPServer:
    """A threaded HTTP server for the API (call ``serve_forever``; port 0 picks a free one).

    `config` is the most any request gets (time, memory) and fixes the backend; with the
    default it must be a strong one, checked here so a weak host fails at start-up.
    """
    from rl_rollout.tools.sandbox import select_backend

    base = (config or SandboxConfig()).validate()
    if base.backend == "auto" and base.remote_url:
        raise ValueError("SandboxConfig.remote_url is set: a service must not forward to itself")
    select_backend(base)

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, code: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/run_code":
                self._reply(404, {"status": "SandboxError", "message": f"no route {self.path}"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._reply(413, {"status": "SandboxError", "message": "body too large"})
                return
            try:
                request = json.loads(self.rfile.read(length) or b"null")
                self._reply(200, handle_run_code(request, base))
            except (RequestError, ValueError) as exc:
                self._reply(400, {"status": "SandboxError", "message": str(exc)})

        def log_message(self, format: str, *args: Any) -> None:  # quiet by default
            pass

    return ThreadingHTTPServer((host, port), Handler)


def start_in_thread(
    host: str = "127.0.0.1", port: int = 0, config: SandboxConfig | None = None
) -> tuple[ThreadingHTTPServer, str]:
    """Start the service in a daemon thread; returns the server and its base URL."""
    server = make_server(host, port, config)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://{server.server_address[0]}:{server.server_address[1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    server = make_server(args.host, args.port)
    print(f"serving /run_code on http://{args.host}:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

"""The scoring worker process: ``python -m rl_algos.rewards.worker FD PARENT_PID MEMORY_MB``.

Imports only this module and the reward functions (never the parent's ``__main__``; keep it
free of torch and rl_core). Protocol over FD (a multiprocessing Connection): parent sends
``sys.path`` and functions to import, worker answers ("ready", None) or ("init_error", text);
then (fn, kwargs) -> ("ok", value) or ("error", text); None stops. ``MEMORY_MB`` > 0 sets
``RLIMIT_DATA``; ``oom_score_adj`` is 1000.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any


def describe(exc: BaseException) -> str:
    """One line: the exception type and message."""
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def _exit_with_parent(parent_pid: int) -> None:
    """Leave when the parent is gone, even while a reward function hangs."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(1)
        time.sleep(1.0)


def limit_memory(megabytes: int) -> None:
    """Cap this process's data at ``megabytes`` and offer it to the OOM killer first."""
    if megabytes > 0:
        import resource

        limit = megabytes * 1024 * 1024
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass  # not Linux, or /proc read-only: the rlimit still holds


def serve(conn: Connection) -> None:
    """Answer calls until told to stop or the parent closes the connection."""
    try:
        sys.path[:0] = [p for p in conn.recv() if p not in sys.path]
        conn.recv()  # unpickling the warm-up functions imports their modules
    except BaseException as exc:
        conn.send(("init_error", describe(exc)))
        return
    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        if message is None:
            return
        reply: tuple[str, Any]
        try:
            fn, kwargs = message
            reply = ("ok", fn(**kwargs))
        except BaseException as exc:
            reply = ("error", describe(exc))
        try:
            conn.send(reply)
        except Exception as exc:  # e.g. an unpicklable return value
            conn.send(("error", f"could not send the result back: {describe(exc)}"))


def main() -> None:
    fd, parent_pid = int(sys.argv[1]), int(sys.argv[2])
    limit_memory(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    serve(Connection(fd))


if __name__ == "__main__":
    main()

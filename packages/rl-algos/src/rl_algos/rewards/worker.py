"""The scoring worker process: ``python -m rl_algos.rewards.worker FD``.

A fresh interpreter (like multiprocessing's spawn, but it does not re-import the parent's
``__main__``, which for the trainer would pull in torch, Ray and the whole CLI): it imports
only this module and the reward functions. Protocol over the socket FD
(multiprocessing Connection, pickled messages):

1. parent -> worker: the parent's ``sys.path``; then a list of functions to import now;
   worker -> parent: ("ready", None) or ("init_error", text).
2. parent -> worker: (fn, kwargs); worker -> parent: ("ok", value) or ("error", text).
3. parent -> worker: None (stop).

Keep this module free of heavy imports (no torch, no rl_core).
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
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    serve(Connection(fd))


if __name__ == "__main__":
    main()

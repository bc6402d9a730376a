"""Connecting a driver to Ray, and cleaning up after it when it dies.

`ensure_ray` is the one place that decides which Ray a driver uses:

* already connected (e.g. inside a Ray worker, or the caller ran ``ray.init``): that one;
* ``RAY_ADDRESS`` set: join that cluster (its own resources apply);
* otherwise: start a new local ("embedded") instance. A plain ``ray.init()`` would
  silently join whatever cluster was started last on this machine
  (``/tmp/ray/ray_current_cluster``), e.g. another user's; ``address="local"`` never does.

An embedded instance gets a watchdog (`_watchdog.py`): a small process in its own session
that kills every process of that Ray (head, agents, workers and what they started) as
soon as the driver is gone, whatever killed it. Without it, after a SIGKILL of the driver
Ray's DashboardAgent and RuntimeEnvAgent stay alive about a minute (they wait for a
time-out on the dead GCS), and a process that ignores the raylet's death would stay
forever. A joined cluster (``RAY_ADDRESS``) is never touched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray

from rl_core.single_controller.ray._watchdog import ENV_VAR, proc_stat

__all__ = ["ensure_ray"]

log = logging.getLogger(__name__)
_WATCHDOG_SCRIPT = Path(__file__).with_name("_watchdog.py")
_watchdog: subprocess.Popen | None = None
_lock = threading.Lock()


def ensure_ray(
    num_cpus: int | None = None,
    *,
    num_gpus: int | None = None,
    resources: dict[str, float] | None = None,
    **init_kwargs: Any,
) -> bool:
    """Connect this process to Ray unless it already is (module docstring: which Ray).

    num_cpus, num_gpus, resources: of an embedded instance (ignored when joining
        ``RAY_ADDRESS``: the cluster's own resources apply).
    init_kwargs: further `ray.init` arguments (``runtime_env``, ``namespace``, ...).

    Returns True when this call connected (the caller owns the connection and calls
    ``ray.shutdown()`` when done), False when Ray was already initialised.

    Call it from the main thread or one that outlives Ray: Ray ties the head processes it
    starts to the thread that started them (``PR_SET_PDEATHSIG``).
    """
    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS")
    with _keep_sigterm_handler():
        if address:
            log.info("joining the Ray cluster at RAY_ADDRESS=%s", address)
            ray.init(address=address, **init_kwargs)
            return True
        if threading.current_thread() is not threading.main_thread():
            log.warning(
                "starting Ray from thread %r: Ray's head processes die when this thread "
                "exits; start it from the main thread",
                threading.current_thread().name,
            )
        _mark_this_driver()
        _start_watchdog()  # before Ray: a driver killed while Ray starts is covered too
        ray.init(
            address="local",
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            resources=resources,
            include_dashboard=False,
            **init_kwargs,
        )
    return True


@contextlib.contextmanager
def _keep_sigterm_handler() -> Iterator[None]:
    """`ray.init` replaces the main thread's SIGTERM handler with ``sys.exit``; an
    application's own handler (installed before) is put back."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and callable(previous):
            signal.signal(signal.SIGTERM, previous)


def _mark_this_driver() -> str:
    """The token every process started from now on inherits (see `_watchdog`); one per
    driver process (a token inherited from a parent driver is replaced)."""
    value = os.environ.get(ENV_VAR, "")
    if not value.startswith(f"{os.getpid()}-"):
        value = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        os.environ[ENV_VAR] = value
    return value


def _start_watchdog() -> None:
    """Start this driver's watchdog once (it serves every later embedded start too)."""
    global _watchdog
    if not sys.platform.startswith("linux"):
        log.debug("no Ray watchdog on %s (it reads /proc)", sys.platform)
        return
    with _lock:
        if _watchdog is not None and _watchdog.poll() is None:
            return
        stat = proc_stat(os.getpid())
        if stat is None:
            log.warning("no Ray watchdog: /proc/%d/stat is unreadable", os.getpid())
            return
        env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
        _watchdog = subprocess.Popen(
            [sys.executable, "-I", str(_WATCHDOG_SCRIPT), str(os.getpid()), str(stat[1]),
             _mark_this_driver()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # no Ctrl-C or process-group signal reaches it
        )  # fmt: skip
        log.debug("Ray watchdog pid %d watches driver %d", _watchdog.pid, os.getpid())


def watchdog_pid() -> int | None:
    """The pid of this driver's running watchdog, if any (for tests and diagnostics)."""
    return _watchdog.pid if _watchdog is not None and _watchdog.poll() is None else None

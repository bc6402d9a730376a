"""`ensure_ray`: which Ray a driver uses, and that an embedded Ray dies with its driver.

Real drivers in subprocesses: driver A's RayWorkerGroup starts an embedded Ray; driver B
joins it through RAY_ADDRESS; driver C, with A's cluster running on this machine and no
RAY_ADDRESS, starts its own. Killing B (-9) leaves A's cluster alone; killing A and C (-9)
removes every process each started, Ray's agents included, within seconds (Ray alone
leaves the DashboardAgent and RuntimeEnvAgent alive about a minute).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

DRIVER = r"""
import json, os, signal, sys, time
import ray
from rl_core.single_controller import Dispatch, ResourcePool, Worker, register
from rl_core.single_controller.ray import RayWorkerGroup, ensure_ray
from rl_core.single_controller.ray.lifecycle import watchdog_pid

def on_term(signum, frame):
    sys.exit(99)

class Pid(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def pid(self):
        return os.getpid()

signal.signal(signal.SIGTERM, on_term)
if sys.argv[1] == "group":  # the group starts Ray itself
    group = RayWorkerGroup(ResourcePool([1], cpus_per_process=0.5), Pid)
    started, worker_pid = ray.is_initialized(), group.pid()[0]
else:
    started, worker_pid = ensure_ray(num_cpus=1), None
print(json.dumps({
    "started": started,
    "again": ensure_ray(num_cpus=1),
    "gcs": ray.get_runtime_context().gcs_address,
    "watchdog": watchdog_pid(),
    "worker_pid": worker_pid,
    "sigterm_kept": signal.getsignal(signal.SIGTERM) is on_term,
}), flush=True)
time.sleep(600)
"""


def _ppid_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process, read from /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            table[int(name)] = (int(rest[1]), rest[0])
    return table


def tree(root: int) -> set[int]:
    """`root` and its living descendants."""
    table = _ppid_table()
    found, todo = {root}, [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, _) in table.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                todo.append(pid)
    return found


def running(pids: set[int]) -> set[int]:
    """The pids still running (a zombie has exited: only its parent's wait is missing)."""
    table = _ppid_table()
    return {p for p in pids if p in table and table[p][1] not in ("Z", "X")}


def start_driver(mode: str, log: Path, ray_address: str | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RL_RAY_DRIVER")}
    env.update(RAY_AUTH_MODE="disabled", RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    with open(log, "w") as err:
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER, mode], env=env, stdout=subprocess.PIPE, stderr=err
        )
    driver.log = log  # type: ignore[attr-defined]
    return driver


def report(driver: subprocess.Popen) -> dict:
    line = driver.stdout.readline()
    if not line:
        tail = driver.log.read_text()[-3000:]  # type: ignore[attr-defined]
        pytest.fail(f"driver {driver.pid} exited with {driver.wait()} before reporting:\n{tail}")
    return json.loads(line)


def wait_gone(pids: set[int], limit_s: float) -> float:
    start = time.monotonic()
    while running(pids):
        left = running(pids)
        assert time.monotonic() - start < limit_s, f"still running after {limit_s} s: {left}"
        time.sleep(0.2)
    return time.monotonic() - start


def test_embedded_ray_dies_with_its_driver_and_a_joined_cluster_is_left_alone(tmp_path):
    drivers: list[subprocess.Popen] = []
    try:
        a = start_driver("group", tmp_path / "a.log")
        drivers.append(a)
        info_a = report(a)
        assert info_a["started"] is True and info_a["again"] is False
        assert info_a["watchdog"] is not None and info_a["sigterm_kept"] is True
        b = start_driver("none", tmp_path / "b.log", ray_address=info_a["gcs"])
        c = start_driver("none", tmp_path / "c.log")
        drivers += [b, c]
        info_b, info_c = report(b), report(c)
        # B joined A's cluster and watches nothing; C never joins the stray cluster A runs
        assert info_b["started"] is True and info_b["gcs"] == info_a["gcs"]
        assert info_b["watchdog"] is None
        assert info_c["gcs"] != info_a["gcs"] and info_c["watchdog"] is not None

        procs_a = tree(a.pid) - {a.pid, info_a["watchdog"]}
        procs_c = tree(c.pid) - {c.pid, info_c["watchdog"]}
        assert info_a["worker_pid"] in procs_a and len(procs_a) >= 5  # gcs, raylet, agents
        os.kill(b.pid, signal.SIGKILL)
        b.wait()
        time.sleep(3)  # B had no watchdog: nothing of A's cluster may go
        assert running(procs_a) == procs_a

        os.kill(a.pid, signal.SIGKILL)
        os.kill(c.pid, signal.SIGKILL)
        took = wait_gone(procs_a | procs_c | {info_a["watchdog"], info_c["watchdog"]}, 20)
        print(f"every process of both embedded Rays gone {took:.1f} s after kill -9")
    finally:
        for driver in drivers:
            if driver.poll() is None:
                driver.kill()
            driver.wait()

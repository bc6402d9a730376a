"""How `rl` commands react to SIGTERM/SIGINT (the full run is in tests/integration).

A stand-in command body in a subprocess: the first signal raises `StopSignal` where the
command runs (so its ``finally`` blocks shut the workers down); a shutdown that hangs is
cut off after the grace period, and a second signal ends the process at once, both with
exit status 128 + signal number and one line saying why.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

BODY = r"""
import sys, time
import rl_algos.cli as cli

cli.SHUTDOWN_GRACE_S = float(sys.argv[1])
try:
    with cli._stop_on_signals("train"):
        try:
            print("running", flush=True)
            time.sleep(60)
        finally:
            print("shutting down", flush=True)
            time.sleep(float(sys.argv[2]))  # the workers' shutdown
except cli.StopSignal as stop:
    print(f"caught {stop}", flush=True)
    sys.exit(128 + stop.signum)
"""


def run(grace_s: float, shutdown_s: float, signals: list[signal.Signals]):
    proc = subprocess.Popen(
        [sys.executable, "-c", BODY, str(grace_s), str(shutdown_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "running\n"
    start = time.monotonic()
    for i, sig in enumerate(signals):
        if i:
            assert proc.stdout.readline() == "shutting down\n"
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err, time.monotonic() - start


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_command_after_its_cleanup(sig):
    code, out, err, _ = run(grace_s=30, shutdown_s=0.2, signals=[sig])
    assert code == 128 + sig
    assert out == f"shutting down\ncaught {sig.name}\n"
    assert err == ""


def test_a_hung_shutdown_is_cut_off_after_the_grace_period():
    code, out, err, took = run(grace_s=1.0, shutdown_s=60, signals=[signal.SIGTERM])
    assert code == 128 + signal.SIGTERM
    assert out == "shutting down\n"  # never finished
    assert err == "rl train: shutdown took over 1 s after SIGTERM; exiting now\n"
    assert 1.0 <= took < 20


def test_a_second_signal_exits_at_once():
    code, out, err, took = run(grace_s=30, shutdown_s=60, signals=[signal.SIGTERM, signal.SIGINT])
    assert code == 128 + signal.SIGINT
    assert out == ""  # "shutting down" was read before the second signal; nothing after
    assert err == "rl train: second signal after SIGINT; exiting now\n"
    assert took < 20

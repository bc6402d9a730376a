"""Failover (``nox -s tests-faults``): a run whose training worker is killed with SIGKILL
finishes on its own, and gives the same weights as a run resumed by hand.

* In process: the training worker of rank 1 is killed during step 3's ``update_actor``
  (``trainer.save_every=2``): the run rebuilds the group, restores ``step_2`` and trains
  to step 8. A second run resumes by hand from a copy of that ``step_2`` checkpoint (the
  one a run stopped at step 3 leaves). The final actor weights and optimizer state are
  bit-identical, and so is every metric of steps 3-8 (wall-clock timings aside); with
  synchronous training and with ``async.max_staleness=1`` under each ``async.on_resume``.
* The `rl` command: ``examples/grpo_tiny.yaml`` with 8 steps and its defaults (in-memory
  snapshots every step); a training worker process is killed with ``kill -9`` during the
  step after step 3 (or a later one) is logged; the command exits 0, steps 1-8 each appear
  once in ``metrics.jsonl``, one restart is logged, and the first step after it logs
  ``failover/restored_step`` = the step before it, ``failover/from_snapshot`` = 1.

The in-process cases set ``trainer.snapshot_every=0``: they check the failover from disk
checkpoints (the snapshots' exact replay is `test_failover_replay.py`'s).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from rl_algos.config import load_config
from rl_algos.trainer.loop import RLTrainer
from rl_algos.trainer.tracking import read_jsonl

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.ray]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
WALL_CLOCK = ("timing/", "perf/", "reward/seconds", "trainer/restarts", "failover/")
FAST = [  # failover from checkpoints: no in-memory snapshots (test_failover_replay.py)
    "actor.loss.kl_loss_coef=0",
    "trainer.total_steps=8",
    "trainer.save_every=2",
    "trainer.snapshot_every=0",
    "trainer.restart_backoff_s=0",
    "data.max_response_length=6",
]


def _engine_state(checkpoint: Path, scratch: Path) -> dict[str, Any]:
    """Model and optimizer state of an engine checkpoint (DCP), as full tensors."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = scratch / f"{checkpoint.parent.parent.parent.name}-{checkpoint.parent.name}.pt"
    dcp_to_torch_save(checkpoint, out)
    flat: dict[str, Any] = {}

    def walk(tree: Any, prefix: str) -> None:
        if isinstance(tree, dict):
            for key, value in tree.items():
                walk(value, f"{prefix}{key}/")
        else:
            flat[prefix.rstrip("/")] = tree

    walk(torch.load(out, weights_only=True), "")
    return flat


def _comparable(rows: list[dict[str, Any]], first: int) -> dict[int, dict[str, Any]]:
    return {
        r["step"]: {k: v for k, v in r.items() if not k.startswith(WALL_CLOCK)}
        for r in rows
        if r["step"] >= first
    }


@pytest.mark.parametrize(
    "mode",
    ["sync", "async-keep", "async-regenerate"],
)
def test_a_killed_training_worker_is_replaced_and_the_run_equals_a_resume(
    ray_cluster, raw_config, tmp_path, caplog, kill_once, mode
):
    import ray

    overrides = list(FAST)
    if mode != "sync":
        overrides += ["async.max_staleness=1", f"async.on_resume={mode.split('-')[1]}"]
    run_dir, hand_dir = tmp_path / "failover", tmp_path / "by-hand"
    trainer = RLTrainer(load_config(raw_config(run_dir, "grpo"), overrides))
    killed: list[int] = []
    train_step = trainer.train_step

    def step_with_a_kill() -> dict[str, float]:
        if trainer.global_step == 2 and not killed:
            # what a run stopped at step 3 leaves: its step_2 checkpoint
            shutil.copytree(run_dir / "checkpoints" / "step_2", hand_dir / "checkpoints" / "step_2")
            shutil.copytree(run_dir / "checkpoints" / "step_2", tmp_path / "at-2" / "x" / "step_2")
            pid = ray.get(trainer.groups.actor.workers[1].ping.remote())
            killed.append(pid)
            kill_once(trainer.groups.actor, "update_actor", pid)
        return train_step()

    trainer.train_step = step_with_a_kill
    start = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, logger="rl_algos.trainer.failover"):
            history = trainer.fit()
        new_pids = [ray.get(w.ping.remote()) for w in trainer.groups.actor.workers]
    finally:
        trainer.close()
    elapsed = time.monotonic() - start
    assert killed and killed[0] not in new_pids  # rank 1 is a new process
    assert [h["step"] for h in history] == list(range(1, 9))
    assert trainer.failover.restarts == 1
    event = trainer.failover.events[0]
    assert (event.role, event.rank, event.resumed_step) == ("actor", 1, 2)
    assert "died during update_actor()" in event.cause
    lines = [r.getMessage() for r in caplog.records if "failover 1/2" in r.getMessage()]
    assert len(lines) == 1, caplog.text
    assert "group 'actor' rank 1 died during update_actor()" in lines[0]
    assert "resumed from step 2" in lines[0]
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 9))  # step 3 once
    assert [r["trainer/restarts"] for r in rows] == [0, 0, 1, 1, 1, 1, 1, 1]
    restored = [(r["step"], r["failover/restored_step"], r["failover/from_snapshot"],
                 r["failover/steps_lost"]) for r in rows if "failover/restored_step" in r]  # fmt: skip
    assert restored == [(3, 2, 0, 0)]  # from the checkpoint of step 2: no step lost
    assert elapsed < 600

    # by hand: a new trainer resumes from the copied step_2 checkpoint
    hand = RLTrainer(
        load_config(raw_config(hand_dir, "grpo"), [*overrides, "trainer.resume=latest"])
    )
    try:
        hand.fit()
    finally:
        hand.close()
    hand_rows = read_jsonl(hand_dir / "metrics.jsonl")
    assert [r["step"] for r in hand_rows] == list(range(3, 9))
    assert _comparable(rows, 3) == _comparable(hand_rows, 3)  # every metric, bitwise
    ours = _engine_state(run_dir / "checkpoints" / "step_8" / "actor", tmp_path)
    theirs = _engine_state(hand_dir / "checkpoints" / "step_8" / "actor", tmp_path)
    assert ours.keys() == theirs.keys()
    tensors = [k for k, v in ours.items() if isinstance(v, torch.Tensor)]
    assert len([k for k in tensors if k.startswith("model/")]) >= 20
    for key in tensors:
        assert torch.equal(ours[key], theirs[key]), key
    at_2 = _engine_state(tmp_path / "at-2" / "x" / "step_2" / "actor", tmp_path)
    assert not all(torch.equal(at_2[k], ours[k]) for k in tensors)  # it trained on
    # pruning kept the newest three, the restore point of each moment among them
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == [
        "step_4",
        "step_6",
        "step_8",
    ]


def _descendants(root: int) -> dict[int, str]:
    """pid -> command line of every live descendant of `root`."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
    found, frontier = set(), {root}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    out = {}
    for pid in found:
        with contextlib.suppress(OSError):
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return out


def test_rl_train_survives_kill_9_of_a_training_worker(tmp_path):
    """The issue's command, with a training worker killed by `kill -9` during step k (the
    step after the one logged last, k >= 4). With the example's defaults (in-memory
    snapshots every step) the first step after the failover logs
    ``failover/restored_step = k-1`` and ``failover/from_snapshot = 1``: no step is lost."""
    out = tmp_path / "run"
    slow = tmp_path / "slow_reward.py"
    # a reward that takes ~0.1 s per sample: steps last long enough to kill one mid-run
    slow.write_text(
        "import time\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    time.sleep(0.1)\n"
        "    return float(solution_str.strip() == str(ground_truth))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="disabled", RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    command = [
        str(Path(sys.executable).with_name("rl")),
        "train",
        str(REPO / "examples" / "grpo_tiny.yaml"),
        "trainer.total_steps=8",
        f"trainer.output_dir={out}",
        "trainer.restart_backoff_s=0",
        f"reward.function_path={slow}",
    ]
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    killed = logged = None
    try:
        deadline = time.monotonic() + 600
        jsonl = out / "metrics.jsonl"
        while killed is None and proc.poll() is None and time.monotonic() < deadline:
            steps = [r["step"] for r in read_jsonl(jsonl)] if jsonl.is_file() else []
            if 3 in steps:
                time.sleep(1.0)  # into the next step: its snapshot has long been sent
                workers = sorted(
                    pid
                    for pid, cmd in _descendants(proc.pid).items()
                    if cmd.startswith("ray::RayWorkerHost")
                )
                assert len(workers) == 2, _descendants(proc.pid)
                logged = max(r["step"] for r in read_jsonl(jsonl))
                os.kill(workers[-1], signal.SIGKILL)
                killed = workers[-1]
            time.sleep(0.05)
        _, stderr = proc.communicate(timeout=max(1, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert killed is not None, "the run ended before step 3 was logged"
    assert proc.returncode == 0, stderr[-4000:]
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows if r["step"] > 0] == list(range(1, 9)), stderr[-3000:]
    restarts = [line for line in stderr.splitlines() if "failover 1/2: group 'actor'" in line]
    assert len(restarts) == 1, stderr[-4000:]
    assert "died during" in restarts[0], restarts[0]
    assert f"resumed from step {logged} (the in-memory snapshot of step {logged})" in restarts[0]
    assert "failover 2/2" not in stderr
    first = next(r for r in rows if r["step"] == logged + 1)  # step k, replayed
    assert first["failover/restored_step"] == logged and first["failover/from_snapshot"] == 1
    assert first["failover/steps_lost"] == 0 and rows[-1]["trainer/restarts"] == 1


def test_past_max_restarts_the_run_stops_with_the_named_error(
    ray_cluster, raw_config, tmp_path, kill_once
):
    """``trainer.max_restarts=0``: the first lost worker ends `fit` with today's error,
    naming the rank and the call, and `close` leaves no worker process behind."""
    import ray

    from rl_core.single_controller.errors import WorkerDiedError

    config = load_config(raw_config(tmp_path / "run", "grpo"), [*FAST, "trainer.max_restarts=0"])
    trainer = RLTrainer(config)
    pids = [ray.get(w.ping.remote()) for w in trainer.groups.actor.workers]
    kill_once(trainer.groups.actor, "update_actor", pids[1])
    try:
        with pytest.raises(WorkerDiedError, match=r"rank 1.* died during update_actor\(\)"):
            trainer.fit()
        assert trainer.failover.restarts == 0
    finally:
        trainer.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.5)
    assert not any(Path(f"/proc/{p}").exists() for p in pids), "worker processes left behind"


def test_split_rollout_replicas_lost_mid_generation_and_mid_sync_are_replaced(
    ray_cluster, raw_config, tmp_path
):
    """``rollout.placement=split`` with two replicas, ``on_replica_loss=replace``: replica 1
    is killed as step 2's generation is dispatched, replica 0 as the weight sync that ends
    step 2 starts. The run trains all 3 steps with full batches (each prompt's group
    complete, no row twice), no trainer restart, and the metrics count both losses."""
    import ray

    config = load_config(
        raw_config(tmp_path / "run", "grpo"),
        [
            *FAST,
            "trainer.total_steps=3",
            "trainer.save_every=0",
            "trainer.snapshot_every=1",  # the trainer's failover stays armed: it must not fire
            "rollout.placement=split",
            "rollout.num_replicas=2",
            "trainer.cpus_per_worker=0.5",
            "rollout.cpus_per_replica=0.25",
            "rollout.on_replica_loss=replace",
        ],
    )
    trainer = RLTrainer(config)
    manager = trainer.rollout.generator.manager
    victims: list[Any] = []
    generate, sync = trainer.rollout.generate_sequences, trainer.rollout.sync_weights
    groups: list[list[int]] = []

    def generate_with_a_kill(batch: Any) -> Any:
        if trainer.global_step == 1 and not victims:
            victims.append(manager.replicas[1])
            ray.kill(manager.replicas[1].actor)
        out = generate(batch)
        uids = out.non_tensor_batch["uid"].tolist()
        groups.append(sorted(uids.count(u) for u in set(uids)))
        return out

    def sync_with_a_kill() -> float:
        if trainer.global_step == 1 and len(victims) == 1:  # the sync that ends step 2
            victims.append(manager.replicas[0])
            ray.kill(manager.replicas[0].actor)
        return sync()

    trainer.rollout.generate_sequences = generate_with_a_kill
    trainer.rollout.sync_weights = sync_with_a_kill
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    assert len(victims) == 2
    assert [h["step"] for h in history] == [1, 2, 3]
    n = config.rollout.n
    assert groups == [[n] * config.data.train_batch_size] * 3  # every group whole, no row twice
    assert trainer.failover.restarts == 0
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert rows[-1]["rollout/replicas_lost"] == 2
    assert rows[-1]["rollout/replicas_replaced"] == 2
    assert rows[-1]["rollout/requests_reissued"] >= 1

"""Fault injection: how fast a run notices a lost worker, is training again, and what it lost.

**Recovery** (the default): ``examples/grpo_tiny.yaml`` (tiny random Qwen2, 2 training
workers on embedded Ray, the colocated hf rollout in each), ``--steps`` steps, for each
engine of ``--engines`` (``fsdp``, ``megatron``: world size 2) and each way to recover:

* ``snapshot``: in-memory snapshots every step (``trainer.snapshot_every=1``), no
  checkpoint on disk;
* ``disk``: a checkpoint every ``--save-every`` steps, no snapshots.

The training worker of rank 1 is killed with SIGKILL as step ``--train-at``'s
``update_actor`` is dispatched. Printed per run: the detection time (kill -> the trainer
noticed), the recovery time (kill -> the end of the first step completed after it), the
step restored and the steps lost (completed steps trained again), and what snapshots cost
per step before the kill: the seconds they held the step up (``timing/snapshot_s``: the
driver's calls, the ranks' capture), the background seconds of the slowest rank (copy +
send to the holder, ``timing/snapshot_background_s``) and the host bytes of one copy
(``perf/snapshot_host_bytes``), against the step time (``timing/step_s``).

**Faults** (``--faults``): the older run of three faults in one run, a training worker
(step ``--train-at``), a rollout replica during ``generate_sequences`` (``--rollout-at``;
colocated, so the training worker's own process) and the reward worker process
(``--reward-at``), then what a restart by hand costs (``rl train ... trainer.resume=latest``
in a new process, until it has loaded the checkpoint).

    uv run python benchmarks/failover.py [--engines fsdp megatron] [--json FILE]
    uv run python benchmarks/failover.py --faults

Timings on a shared machine are upper bounds: say how loaded it was.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "grpo_tiny.yaml"


def _fit(trainer: Any) -> tuple[list[Any], float]:
    """Run `trainer` to the end and close it: its failover events and the seconds taken."""
    start = time.monotonic()
    try:
        trainer.fit()
        events = list(trainer.failover.events)
    finally:
        trainer.close()
    return events, time.monotonic() - start


def _kill_in(group: Any, method: str, pid: int, note: dict[str, float]) -> None:
    """SIGKILL `pid` as the group's next `method` call is dispatched (once)."""
    original = getattr(group, method)

    def call(*args: Any, **kwargs: Any) -> Any:
        setattr(group, method, original)
        note["killed_at"] = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        return original(*args, **kwargs)

    setattr(group, method, call)


def _overrides(out: Path, args: argparse.Namespace) -> list[str]:
    return [
        f"trainer.output_dir={out}",
        f"trainer.total_steps={args.steps}",
        f"trainer.save_every={args.save_every}",
        "trainer.val_every=0",
        "trainer.max_restarts=3",
        "trainer.restart_backoff_s=0",
        "trainer.loggers=[jsonl]",
        "reward.num_workers=1",
    ]


RECOVERY = {
    "snapshot": ["trainer.snapshot_every=1", "trainer.save_every=0"],
    "disk": ["trainer.snapshot_every=0"],  # trainer.save_every from --save-every
}
ENGINES = {"fsdp": [], "megatron": ["actor.engine=megatron"]}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def recover(args: argparse.Namespace, engine: str, how: str) -> dict[str, Any]:
    """One run of `engine` recovering by `how` from a training worker killed mid-update."""
    import ray
    from omegaconf import OmegaConf

    from rl_algos.config import load_config
    from rl_algos.trainer.loop import RLTrainer
    from rl_algos.trainer.tracking import read_jsonl

    out = Path(tempfile.mkdtemp(prefix=f"failover-{engine}-{how}-")) / "run"
    raw = OmegaConf.to_container(OmegaConf.load(EXAMPLE), resolve=False)
    overrides = [*_overrides(out, args), *ENGINES[engine], *RECOVERY[how]]
    trainer = RLTrainer(load_config(raw, overrides))
    note: dict[str, float] = {}
    done_at: list[tuple[int, float]] = []
    train_step = trainer.train_step

    def step() -> dict[str, float]:
        actor = trainer.groups.actor
        if trainer.global_step + 1 == args.train_at and not note:
            pid = ray.get(actor.workers[1].ping.remote())
            _kill_in(actor, "update_actor", pid, note)
        metrics = train_step()
        done_at.append((trainer.global_step, time.monotonic()))
        return metrics

    trainer.train_step = step
    events, total = _fit(trainer)
    rows = read_jsonl(out / "metrics.jsonl")
    (event,) = events
    killed = note["killed_at"]
    first = min(t for _, t in done_at if t > event.rebuilt_at)
    after = next(r for r in rows if "failover/restored_step" in r)
    steady = [r for r in rows if 1 < r["step"] < args.train_at]  # before the kill, warm
    step_s = _mean([r["timing/step_s"] for r in steady])
    snap_s = _mean([r["timing/snapshot_s"] for r in steady if "timing/snapshot_s" in r])
    background = [
        r["timing/snapshot_background_s"] for r in steady if "timing/snapshot_background_s" in r
    ]
    host = [r["perf/snapshot_host_bytes"] for r in rows if "perf/snapshot_host_bytes" in r]
    return {
        "engine": engine,
        "recovery": how,
        "detected_s": event.detected_at - killed,
        "recovered_s": first - killed,
        "restored_step": int(after["failover/restored_step"]),
        "from_snapshot": bool(after["failover/from_snapshot"]),
        "steps_lost": int(after["failover/steps_lost"]),
        "step_s": step_s,
        "snapshot_s": snap_s,
        "snapshot_share": snap_s / step_s if how == "snapshot" else float("nan"),
        "snapshot_background_s": _mean(background),
        "snapshot_host_bytes": host[-1] if host else float("nan"),
        "run_s": total,
    }


def recovery_matrix(args: argparse.Namespace) -> list[dict[str, Any]]:
    return [recover(args, engine, how) for engine in args.engines for how in RECOVERY]


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from omegaconf import OmegaConf

    from rl_algos.config import load_config
    from rl_algos.trainer.loop import RLTrainer

    out = Path(tempfile.mkdtemp(prefix="failover-bench-")) / "run"
    raw = OmegaConf.to_container(OmegaConf.load(EXAMPLE), resolve=False)
    trainer = RLTrainer(load_config(raw, _overrides(out, args)))
    faults: dict[str, dict[str, float]] = {"training worker": {}, "rollout replica": {}}
    faults["reward worker"] = {}
    done_at: list[tuple[int, float]] = []  # (global step, when it completed)
    train_step = trainer.train_step
    score = trainer._score

    def step() -> dict[str, float]:
        at = trainer.global_step + 1  # the step about to run
        actor = trainer.groups.actor
        if at == args.train_at and not faults["training worker"]:
            pid = ray.get(actor.workers[1].ping.remote())
            _kill_in(actor, "update_actor", pid, faults["training worker"])
        if at == args.rollout_at and not faults["rollout replica"]:
            pid = ray.get(actor.workers[0].ping.remote())
            _kill_in(actor, "generate_sequences", pid, faults["rollout replica"])
        metrics = train_step()
        done_at.append((trainer.global_step, time.monotonic()))
        return metrics

    def score_with_a_kill(batch: Any, shaping: bool = True) -> Any:
        note = faults["reward worker"]
        if trainer.global_step + 1 == args.reward_at and not note:
            pool = trainer.reward._pool
            pid = pool._workers[0].process.pid

            def watch() -> None:  # noticed: the pool let go of the dead process
                while time.monotonic() - note["killed_at"] < 120:
                    if all(w.process.pid != pid for w in list(pool._workers)):
                        note["detected_at"] = time.monotonic()
                        return
                    time.sleep(0.005)

            note["killed_at"] = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            threading.Thread(target=watch, daemon=True).start()
            note["step"] = trainer.global_step + 1
        return score(batch, shaping)

    trainer.train_step = step
    trainer._score = score_with_a_kill
    events, total = _fit(trainer)

    rows = []
    trainer_faults = [faults["training worker"], faults["rollout replica"]]
    for (name, note), event in zip(
        [("training worker", trainer_faults[0]), ("rollout replica", trainer_faults[1])], events
    ):
        killed = note["killed_at"]
        first = min(t for _, t in done_at if t > event.rebuilt_at)
        failed_at = max((s for s, t in done_at if t < killed), default=0)
        rows.append(
            {
                "fault": name,
                "detected_s": event.detected_at - killed,
                "recovered_s": first - killed,
                "steps_lost": failed_at - event.resumed_step,
                "how": f"group rebuilt, resumed from step {event.resumed_step} "
                f"({event.restored_from or 'the initial weights'})",
            }
        )
    note = faults["reward worker"]
    if note:
        killed = note["killed_at"]
        first = min(t for s, t in done_at if t > killed)
        rows.append(
            {
                "fault": "reward worker",
                "detected_s": note.get("detected_at", float("nan")) - killed,
                "recovered_s": first - killed,
                "steps_lost": 0,
                "how": "the reward pool started a new process; no call lost",
            }
        )

    # what a restart by hand costs: a new process up to the loaded checkpoint
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [
        str(Path(sys.executable).with_name("rl")),
        "train",
        str(EXAMPLE),
        *_overrides(out, args),
        "trainer.resume=latest",
    ]
    began = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=out.parent)
    resume_setup = time.monotonic() - began
    if proc.returncode != 0:
        raise SystemExit(f"the resume run failed:\n{proc.stderr[-3000:]}")
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {
        "rows": rows,
        "resume_setup_s": resume_setup,
        "run_s": total,
        "restarts": len(events),
        "steps_logged": steps,
        "load_avg": os.getloadavg(),
        "cpus": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--save-every", type=int, default=2)
    parser.add_argument("--train-at", type=int, default=6)
    parser.add_argument("--rollout-at", type=int, default=5)
    parser.add_argument("--reward-at", type=int, default=7)
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    parser.add_argument("--faults", action="store_true", help="the three-fault run instead")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.faults:
        args.steps = max(args.steps, 8)
        _print_faults(run(args), args)
        return
    rows = recovery_matrix(args)
    load = os.getloadavg()[0]
    print(f"\nrecovery from a training worker killed in step {args.train_at}'s update, world "
          f"size 2, on {os.cpu_count()} CPUs, load average {load:.1f}")  # fmt: skip
    print("| engine | recovery | detection s | kill -> first recovered step s | restored step | "
          "steps lost | step s | snapshot s/step (share) | snapshot background s | "
          "snapshot host bytes |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        snap = (
            f"{r['snapshot_s'] * 1000:.1f} ms ({r['snapshot_share']:.1%})"
            if r["recovery"] == "snapshot"
            else "-"
        )
        back = f"{r['snapshot_background_s'] * 1000:.1f} ms" if r["recovery"] == "snapshot" else "-"
        size = f"{r['snapshot_host_bytes'] / 1e6:.2f} MB" if r["recovery"] == "snapshot" else "-"
        print(
            f"| {r['engine']} | {r['recovery']} | {r['detected_s']:.2f} | {r['recovered_s']:.1f} | "
            f"{r['restored_step']} | {r['steps_lost']} | {r['step_s']:.2f} | {snap} | {back} | "
            f"{size} |"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"rows": rows, "load_avg": load, "cpus": os.cpu_count()}, indent=1)
        )


def _print_faults(result: dict[str, Any], args: argparse.Namespace) -> None:
    budget = 60 + result["resume_setup_s"]
    print(f"\nfailover on {result['cpus']} CPUs, load average {result['load_avg'][0]:.1f}")
    print("| fault | detection s | recovery s | steps lost | goal: recovery <= | how |")
    print("|---|---|---|---|---|---|")
    for row in result["rows"]:
        ok = "yes" if row["recovered_s"] <= budget else "NO"
        print(
            f"| {row['fault']} | {row['detected_s']:.2f} | {row['recovered_s']:.1f} | "
            f"{row['steps_lost']} | {budget:.0f} s ({ok}) | {row['how']} |"
        )
    print(
        f"\nresume=latest set-up (new process to loaded checkpoint): "
        f"{result['resume_setup_s']:.1f} s; whole run {result['run_s']:.0f} s, "
        f"{result['restarts']} restarts; steps in metrics.jsonl: {result['steps_logged']}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

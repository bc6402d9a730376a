"""Fault injection: how fast a run notices a lost worker and is training again.

One run of ``examples/grpo_tiny.yaml`` (tiny random Qwen2, 2 training workers on embedded
Ray, the colocated hf rollout in each, one reward worker process), ``--steps`` steps with a
checkpoint every ``--save-every``. In turn it kills with SIGKILL:

1. a training worker (rank 1) while it runs ``update_actor`` (step ``--train-at``);
2. a rollout replica while it runs ``generate_sequences`` (step ``--rollout-at``); in the
   colocated placement the replica is the training worker's own process (rank 0 here);
3. the reward worker process as scoring begins (step ``--reward-at``): the pool notices
   the dead process when it hands out the batch's calls and starts a new one.

For each it prints the detection time (death -> the trainer or the reward pool noticed it),
the recovery time (death -> the end of the first step completed after it) and the steps
lost (steps trained again because they came after the restored checkpoint). Then, in the
same run, it times what a restart by hand costs: ``rl train ... trainer.resume=latest`` in
a new process, until it has loaded the checkpoint (it has nothing left to train). The goal
on CPU: recovery <= 60 s + that set-up time.

    uv run python benchmarks/failover.py [--steps 8] [--json FILE]

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
    start = time.monotonic()
    try:
        trainer.fit()
        events = list(trainer.failover.events)
    finally:
        trainer.close()
    total = time.monotonic() - start

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
                "how": f"group rebuilt, resumed from step {event.resumed_step}",
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
    parser.add_argument("--train-at", type=int, default=3)
    parser.add_argument("--rollout-at", type=int, default=5)
    parser.add_argument("--reward-at", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    result = run(args)
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

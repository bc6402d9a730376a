"""Env steps per second: the VLA simulators alone, and the policy loop on worker groups.

    uv run python benchmarks/vla_env_throughput.py [--batch 8] [--seconds 3] [--chunk 1]
    uv run python benchmarks/vla_env_throughput.py --loop [--rounds 3]   # the policy loop

``--loop`` measures the episode loop of `rl train examples/grpo_vla_reach.yaml` (32 envs,
6 policy steps, sampled actions, the tiny VLM policy): env steps/s (policy steps taken per
second of the loop) and policy steps/s (per second spent in the rollout's actions),
with 1 and 2 env workers (Ray actors; 2: two pipelined halves), and, in the same run, the
baseline: the single-process runner this replaced (its env worker processes, its
``run_episodes``) with ``env.num_workers=2``, taken from git (the parent of the commit that
removed it) and run in a subprocess.

Environments: the built-in ``reach`` (numpy + PIL), PushT (``gym-pusht``, pymunk + pygame)
and MetaWorld ``reach-v3`` (MuJoCo, ``MUJOCO_GL=egl`` unless set); a simulator whose package
is not installed is skipped with a note. Everything runs in this one process, single
threaded (so the rates are per core), with random action chunks; an env that ends is
reset (the reset time counts). With ``--chunk 1`` every step returns a rendered observation,
as the policy loop needs. The machine's load average is printed next to the table: on a
shared machine the rates fall with it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def reach(num_envs: int) -> Any:
    from rl_multimodal.vla.envs import ReachConfig, ReachEnv

    return ReachEnv(num_envs, ReachConfig(image_size=84, max_steps=50, max_chunk=8))


def pusht(num_envs: int) -> Any:
    from rl_multimodal.vla.envs.sims import make_pusht

    return make_pusht(num_envs, image_size=64)


def metaworld(num_envs: int) -> Any:
    from rl_multimodal.vla.envs.sims import make_metaworld

    return make_metaworld(num_envs, task="reach-v3", image_size=64)


ENVS: dict[str, tuple[str, Callable[[int], Any]]] = {
    "reach (built in, 84 px)": ("rl_multimodal", reach),
    "PushT (gym-pusht, 64 px)": ("gym_pusht", pusht),
    "MetaWorld reach-v3 (EGL, 64 px)": ("metaworld", metaworld),
}


def steps_per_s(env: Any, seconds: float, chunk: int, seed: int = 0) -> float:
    """Primitive env steps per second over about `seconds` (after one warm-up chunk)."""
    rng = np.random.default_rng(seed)
    spec = env.action_spec
    n = env.num_envs

    def actions() -> np.ndarray:
        return rng.uniform(spec.low, spec.high, (n, chunk, spec.action_dim)).astype(np.float32)

    env.reset(list(range(n)))
    env.step(actions())  # warm-up: first render, lazy imports
    env.reset(list(range(n, 2 * n)))
    done = np.zeros(n, bool)
    executed, episode = 0, 1
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        if done.all():
            episode += 1
            env.reset(list(range(episode * n, (episode + 1) * n)))
            done[:] = False
        result = env.step(actions())
        ended = np.asarray(result.done, bool)
        # exact for chunk 1; with longer chunks an env ending inside one counts 1 action
        executed += chunk * int((~ended).sum()) + int((ended & ~done).sum())
        done = ended
    return executed / (time.perf_counter() - start)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "grpo_vla_reach.yaml")
# the single-process runner: `run_episodes(policy, env, seeds, max_steps)` in this file,
# until the commit that moved the loop onto worker groups (the last to remove the string)
OLD_RUNNER = "packages/rl-multimodal/src/rl_multimodal/vla/rollout.py"
OLD_SIGNATURE = "    policy: VLAPolicy,"

BASELINE = """
import json, sys, time, functools, torch
torch.set_num_threads(1)
from rl_multimodal.vla import VLAPolicy, VLAPolicyConfig, run_episodes
from rl_multimodal.vla.envs import EnvWorkerPool, ReachConfig, ReachEnv
from rl_multimodal.vlm.tiny import resolve_tiny_vlm
rounds = int(sys.argv[1])
cfg = ReachConfig(image_size=84, distance=0.3, radius=0.12, step_size=0.15, max_steps=6, n_directions=4)
with EnvWorkerPool(functools.partial(ReachEnv, config=cfg), 32, num_workers=2) as env:
    torch.manual_seed(0)
    policy = VLAPolicy.from_pretrained(resolve_tiny_vlm("qwen2_5_vl"), env.action_spec,
        VLAPolicyConfig(head="tokens", n_bins=3, image_grid=3, freeze_vision=True))
    policy.eval()
    run_episodes(policy, env, list(range(32)), 6)  # warm-up
    steps = wall = policy_s = 0.0
    for r in range(rounds):
        t0 = time.perf_counter()
        ep = run_episodes(policy, env, [1000 * (r + 1) + i // 4 for i in range(32)], 6)
        wall += time.perf_counter() - t0
        steps += ep.env_steps
        policy_s += ep.policy_time_s
print(json.dumps({"env_steps_per_s": steps / wall, "policy_steps_per_s": steps / policy_s}))
"""


def baseline_loop(rounds: int) -> dict[str, float] | str:
    """The replaced single-process runner (2 env worker processes), from git, in a subprocess."""
    import json
    import subprocess
    import tempfile

    removed = subprocess.run(
        ["git", "-C", REPO, "log", "-1", "--format=%H", "-S", OLD_SIGNATURE, "--", OLD_RUNNER],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if not removed:
        return "baseline skipped: the old runner is not in this repository's history"
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "-C", REPO, "archive", f"{removed}^", "packages/rl-multimodal/src"],
            capture_output=True, check=True,
        ).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        env = dict(os.environ, PYTHONPATH=os.path.join(tmp, "packages/rl-multimodal/src"))
        out = subprocess.run(
            [sys.executable, "-c", BASELINE, str(rounds)],
            capture_output=True, text=True, env=env, timeout=1800,
        )  # fmt: skip
        if out.returncode != 0:
            return f"baseline failed: {out.stderr.strip().splitlines()[-1:]}"
        return json.loads(out.stdout.strip().splitlines()[-1])


def worker_group_loop(num_workers: int, rounds: int) -> dict[str, float]:
    """The episode loop of `rl train` on Ray: `num_workers` env workers, the actor's rollout."""
    from rl_algos.config import load_config
    from rl_algos.trainer.loop import RLTrainer
    from rl_algos.trainer.vla_episodes import play_episodes

    cfg = load_config(
        EXAMPLE,
        [f"env.num_workers={num_workers}", "trainer.output_dir=/tmp/vla_env_throughput",
         "trainer.loggers=[]"],
    )  # fmt: skip
    trainer = RLTrainer(cfg)
    envs, rollout = trainer.env_source.envs, trainer.rollout
    try:
        play_episodes(envs, rollout, "train", np.arange(32), 6, False)  # warm-up
        steps = wall = policy_s = 0.0
        for r in range(rounds):
            t0 = time.perf_counter()
            seeds = np.array([1000 * (r + 1) + i // 4 for i in range(32)])
            ep = play_episodes(envs, rollout, "train", seeds, 6, False)
            wall += time.perf_counter() - t0
            steps += float(ep.mask.sum())
            policy_s += ep.policy_time_s
    finally:
        trainer.close()
    return {"env_steps_per_s": steps / wall, "policy_steps_per_s": steps / policy_s}


def loop_main(rounds: int) -> None:
    load = os.getloadavg()
    print(
        f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cores)"
    )
    print("| runner | env workers | env steps/s | policy steps/s |")
    print("|---|---|---|---|")
    base = baseline_loop(rounds)
    if isinstance(base, str):
        print(base)
    else:
        print(f"| before: single process + worker processes | 2 | {base['env_steps_per_s']:.1f} "
              f"| {base['policy_steps_per_s']:.1f} |", flush=True)  # fmt: skip
    for workers in (1, 2):
        r = worker_group_loop(workers, rounds)
        print(f"| worker groups (Ray) | {workers} | {r['env_steps_per_s']:.1f} "
              f"| {r['policy_steps_per_s']:.1f} |", flush=True)  # fmt: skip
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="envs stepped together")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per measurement")
    parser.add_argument("--chunk", type=int, default=1, help="actions per step call")
    parser.add_argument("--loop", action="store_true", help="measure the policy loop")
    parser.add_argument("--rounds", type=int, default=3, help="--loop: timed rounds of episodes")
    args = parser.parse_args()
    if args.loop:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        loop_main(args.rounds)
        return
    import importlib.util

    import torch

    torch.set_num_threads(1)
    load = os.getloadavg()
    print(
        f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cores)"
    )
    print(f"| environment | 1 env (steps/s) | {args.batch} envs (steps/s) |")
    print("|---|---|---|")
    notes = []
    for name, (package, make) in ENVS.items():
        if importlib.util.find_spec(package) is None:
            notes.append(f"{name}: skipped, `{package}` is not installed (rl-multimodal[sim])")
            continue
        rates = []
        for num_envs in (1, args.batch):
            env = make(num_envs)
            try:
                rates.append(steps_per_s(env, args.seconds, args.chunk))
            finally:
                env.close()
        print(f"| {name} | {rates[0]:.0f} | {rates[1]:.0f} |", flush=True)
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()

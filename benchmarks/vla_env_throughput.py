"""Env steps per second on one CPU core: the VLA simulators, one env vs a batch of envs.

    uv run python benchmarks/vla_env_throughput.py [--batch 8] [--seconds 3] [--chunk 1]

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="envs stepped together")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per measurement")
    parser.add_argument("--chunk", type=int, default=1, help="actions per step call")
    args = parser.parse_args()
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

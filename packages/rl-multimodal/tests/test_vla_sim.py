"""Real simulators from PyPI through the Gymnasium adapter: gym-pusht and MetaWorld.

Run by ``nox -s tests-rl-multimodal-sim`` (rl-multimodal[sim]). Each test prints the
measured env steps/s of one process (one core).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

pytestmark = pytest.mark.sim
gymnasium = pytest.importorskip("gymnasium")


def _steps_per_s(env, chunks: int = 6, chunk: int = 4) -> float:
    rng = np.random.default_rng(0)
    spec = env.action_spec
    t0 = time.perf_counter()
    n = 0
    for _ in range(chunks):
        a = rng.uniform(spec.low, spec.high, (env.num_envs, chunk, spec.action_dim))
        step = env.step(a)
        n += env.num_envs * chunk - int(step.done.sum())  # rough: ended envs stop early
    return n / (time.perf_counter() - t0)


def test_pusht_adapter_matches_direct_env_and_is_deterministic():
    pytest.importorskip("gym_pusht")
    from rl_multimodal.vla.envs.sims import make_pusht

    env = make_pusht(2, image_size=64)
    obs = env.reset([7, 7])
    assert obs.images.shape == (2, 64, 64, 3) and obs.proprio.shape == (2, 2)
    np.testing.assert_array_equal(obs.images[0], obs.images[1])
    assert obs.images.std() > 5  # a drawn scene, not a blank frame
    direct = gymnasium.make(
        "gym_pusht/PushT-v0",
        obs_type="pixels_agent_pos",
        observation_width=64,
        observation_height=64,
    )
    ref_obs, _ = direct.reset(seed=7)
    np.testing.assert_array_equal(obs.images[0], ref_obs["pixels"])
    chunk = np.array([[[300, 300], [320, 310], [340, 320]]] * 2, np.float32)
    step = env.step(chunk)
    want = sum(direct.step(a)[1] for a in chunk[0])
    np.testing.assert_allclose(step.reward[0], want, rtol=1e-6)
    np.testing.assert_allclose(step.reward[0], step.reward[1], rtol=1e-6)
    assert step.info["success"].dtype == bool
    rate = _steps_per_s(env)
    print(f"\npusht: {rate:.0f} env steps/s on one core (64x64 pixels)")
    assert rate > 5
    env.close()


def test_metaworld_renders_headless_and_steps():
    pytest.importorskip("metaworld")
    from rl_multimodal.vla.envs.sims import make_metaworld

    env = make_metaworld(2, task="reach-v3", image_size=64, max_episode_steps=20)
    obs = env.reset([3, 3])
    assert obs.images.shape == (2, 64, 64, 3) and obs.proprio.shape == (2, 39)
    assert obs.instructions == ["reach", "reach"]
    assert obs.images.std() > 5
    np.testing.assert_allclose(obs.proprio[0], obs.proprio[1])  # same seed, same state
    model = env.envs[0].unwrapped.model
    assert model.vis.quality.shadowsize == 0 and model.vis.quality.offsamples == 0
    step = env.step(np.zeros((2, 2, 4), np.float32))
    np.testing.assert_allclose(step.reward[0], step.reward[1], rtol=1e-5)
    assert step.info["success"].shape == (2,)
    rate = _steps_per_s(env, chunks=3)
    print(f"\nmetaworld reach-v3: {rate:.0f} env steps/s on one core (64x64, MUJOCO_GL=egl)")
    assert rate > 2
    env.close()


EXAMPLES = __import__("pathlib").Path(__file__).parents[3] / "examples"


SIM_ENVS = {
    "pusht": ("gym_pusht", {"name": "pusht", "options": {"image_size": 56, "max_chunk": 4}}),
    "metaworld-reach-v3": (
        "metaworld",
        {
            "name": "metaworld",
            "options": {"task": "reach-v3", "image_size": 56, "max_episode_steps": 20},
        },
    ),
}


@pytest.mark.parametrize("sim", sorted(SIM_ENVS))
def test_rl_train_runs_a_few_steps_on_the_simulator(tmp_path, sim):
    """`rl train` on the simulators: env worker group on Ray, the engine's updates, frames."""
    import json

    from omegaconf import OmegaConf

    from rl_algos.cli import main

    package, env = SIM_ENVS[sim]
    pytest.importorskip(package)
    config = OmegaConf.load(EXAMPLES / "grpo_vla_pusht.yaml")
    config.env = {**env, "num_workers": 2, "cpus_per_worker": 0.5}
    path = tmp_path / f"{sim}.yaml"
    OmegaConf.save(config, path)
    code = main(["train", str(path), f"trainer.output_dir={tmp_path}", "trainer.total_steps=2",
                 "trainer.val_every=2", "vla.groups=1", "rollout.n=2", "vla.max_steps=2",
                 "vla.val_episodes=2", "vla.n_bins=16"])  # fmt: skip
    assert code == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 2 and 0.0 <= rows[-1]["val/success_rate"] <= 1.0
    assert np.isfinite(rows[-1]["train/mean_return"]) and np.isfinite(rows[-1]["actor/pg_loss"])
    assert (tmp_path / "frames" / "val_step0002.png").is_file()

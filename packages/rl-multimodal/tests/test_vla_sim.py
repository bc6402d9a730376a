"""Real simulators from PyPI through the Gymnasium adapter: gym-pusht and MetaWorld.

Run by ``nox -s tests-rl-multimodal-sim`` (rl-multimodal[sim]). Each test prints the
measured env steps/s of one process (one core).
"""

from __future__ import annotations

import functools
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


def test_pusht_training_step_in_worker_processes(tmp_path):
    """The PushT config's path: env worker processes, tiny VLM policy, one GRPO step, frames."""
    pytest.importorskip("gym_pusht")
    import torch

    from rl_multimodal.vla import VLAPolicy, VLAPolicyConfig, VLATrainer, VLATrainerConfig
    from rl_multimodal.vla.envs import EnvWorkerPool
    from rl_multimodal.vla.envs.sims import make_pusht
    from rl_multimodal.vlm.tiny import resolve_tiny_vlm

    torch.set_num_threads(1)
    factory = functools.partial(make_pusht, image_size=56, max_chunk=4)
    cfg = VLATrainerConfig(
        total_steps=1,
        groups=1,
        n=2,
        max_steps=2,
        epochs=1,
        val_seeds=[50, 51],
        val_every=1,
        output_dir=str(tmp_path),
    )
    with EnvWorkerPool(factory, 2, num_workers=2) as env, EnvWorkerPool(factory, 2, 1) as val:
        policy = VLAPolicy.from_pretrained(
            resolve_tiny_vlm("qwen2_5_vl"), env.action_spec, VLAPolicyConfig(n_bins=16)
        )
        history = VLATrainer(policy, env, val, cfg).fit()
    assert 0.0 <= history[-1]["val/success_rate"] <= 1.0
    assert np.isfinite(history[-1]["train/mean_return"])
    assert (tmp_path / "frames" / "val_step0001.png").is_file()

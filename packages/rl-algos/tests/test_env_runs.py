"""Text-environment runs of the trainer, driver side: the env section's checks, episodes
mixed by weight (seeded, tasks computed in a worker process), failed episodes dropped and
counted with a bound, episode metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_algos.config import ConfigError, load_config
from rl_algos.trainer.env_episodes import (
    EnvEpisodeSource,
    EnvFailureBoundError,
    drop_failed_episodes,
    episode_metrics,
)
from rl_core.protocol import DataProto

DIGITS = "rl_core.testing.text_env:TwoTurnDigitEnv"
FAULTY = "rl_core.testing.text_env:FaultyTextEnv"


def env_config(env, *overrides):
    return load_config({"model": {"path": "m"}, "env": env}, list(overrides))


def test_an_env_run_needs_no_prompt_files():
    cfg = env_config({"name": DIGITS, "options": {"bonus": 1.0}, "val_episodes": 4})
    assert cfg.env.specs[0].name == DIGITS and cfg.env.val_episodes == 4


@pytest.mark.parametrize(
    ("env", "overrides", "key", "expected"),
    [
        ({"name": "nosuch:thing"}, [], "env.name", "a text environment (registered: "),
        ({"mix": [{"name": DIGITS}, {"name": "reach"}]}, [], "env.mix[1].name", "TextEnv"),
        ({"name": DIGITS}, ["data.train_files=[a.jsonl]"], "data.train_files", "episodes"),
        ({"name": DIGITS}, ["reward.function_path=r.py"], "reward.function_path", "rewards"),
        ({"name": DIGITS}, ["algorithm.adv_estimator=remax"], "algorithm.adv_estimator", ""),
        ({"name": DIGITS, "max_tokens_per_turn": 0}, [], "env.max_tokens_per_turn", "null or"),
        ({"name": DIGITS, "val_episodes": -1}, [], "env.val_episodes", ">= 0"),
    ],
)
def test_env_section_errors_name_the_key(env, overrides, key, expected):
    with pytest.raises(ConfigError) as err:
        env_config(env, *overrides)
    assert err.value.path == key and expected in str(err.value)
    assert "\n" not in str(err.value)


def test_episodes_are_mixed_by_weight_and_seeded():
    cfg = env_config({"mix": [{"name": DIGITS, "weight": 3}, {"name": FAULTY, "weight": 1}]})
    source = EnvEpisodeSource(cfg.env, batch_size=400, seed=5)
    try:
        first = source.batch(0)
        assert source.batch(0).non_tensor_batch["env_task"].tolist() == (
            first.non_tensor_batch["env_task"].tolist()
        )
        names = first.non_tensor_batch["env_name"].tolist()
        assert abs(names.count(DIGITS) / 400 - 0.75) < 0.07
        assert names != source.batch(1).non_tensor_batch["env_name"].tolist()
        assert first.non_tensor_batch["data_source"].tolist() == names
        tasks = first.non_tensor_batch["env_task"].tolist()
        assert all(isinstance(t, dict) and "word" in t for t in tasks)
        seeds = first.non_tensor_batch["env_seed"].tolist()
        assert len(set(seeds)) > 390  # one episode seed per task
        # the tasks come from a worker process, not from this one
        assert source.pool._workers[0].process.pid is not None
        assert next(iter(source)).non_tensor_batch["env_name"].tolist() == names
        assert source.state_dict() == {"index": 1}
    finally:
        source.close()


def test_validation_tasks_are_held_out():
    cfg = env_config({"name": DIGITS, "val_episodes": 5})
    source = EnvEpisodeSource(cfg.env, batch_size=5, seed=0)
    try:
        val = source.val_batch().non_tensor_batch["env_task"].tolist()
        train = source.batch(0).non_tensor_batch["env_task"].tolist()
        assert len(val) == 5 and {t["index"] for t in val}.isdisjoint(t["index"] for t in train)
    finally:
        source.close()


def _episodes(errors, names):
    n = len(errors)
    return DataProto.from_dict(
        {"env_rewards": torch.arange(n, dtype=torch.float32)[:, None].repeat(1, 3)},
        {
            "env_error": np.array(errors, dtype=object),
            "env_name": np.array(names, dtype=object),
            "finish_reason": np.array(["terminated"] * n, dtype=object),
        },
    )


def test_failed_episodes_are_dropped_and_counted():
    batch = _episodes([None, "environment 'b' turn 1: boom", None, None], ["a", "b", "a", "b"])
    kept, metrics = drop_failed_episodes(batch, 0.25)
    assert len(kept) == 3 and kept.non_tensor_batch["env_error"].tolist() == [None] * 3
    assert kept.batch["env_rewards"][:, 0].tolist() == [0.0, 2.0, 3.0]
    assert metrics == {
        "env/episodes": 4.0,
        "env/failed_episodes": 1.0,
        "env/failed_episodes/a": 0.0,
        "env/failed_episodes/b": 1.0,
    }
    with pytest.raises(EnvFailureBoundError, match=r"1 of 4 episodes failed \(25%\), over "
                       r"env.max_failure_fraction=0.2; errors: 1x environment 'b' turn 1"):  # fmt: skip
        drop_failed_episodes(batch, 0.2)
    # a dead worker fails every episode on it, each at its own call: all distinct errors are
    # named with their counts, most frequent first, whatever the row order
    died = "the environment worker process died (exit code 13)"
    shared = _episodes(
        [f"env 'b': open(): {died}", f"env 'b' turn 1: step(): {died}",
         f"env 'b' turn 1: step(): {died}", "e4", "e5", "e5", None, None],
        ["b"] * 8,
    )  # fmt: skip
    with pytest.raises(EnvFailureBoundError) as err:
        drop_failed_episodes(shared, 0.5)
    assert str(err.value).endswith(
        f"errors: 2x env 'b' turn 1: step(): {died}; 2x e5; 1x env 'b': open(): {died}; "
        "and 1 other distinct errors"
    )
    with pytest.raises(EnvFailureBoundError, match="2 of 2 episodes failed"):
        drop_failed_episodes(_episodes(["x", "y"], ["a", "a"]), 1.0)
    _, val = drop_failed_episodes(batch, 0.5, "val")
    assert val["val/env/failed_episodes"] == 1.0


def test_episode_metrics():
    metrics = episode_metrics(_episodes([None] * 4, ["a", "b", "a", "b"]))
    assert metrics["env/reward/mean"] == pytest.approx(4.5)  # rows sum to 0, 3, 6, 9
    assert metrics["env/reward/a"] == pytest.approx(3.0)
    assert metrics["env/reward/b"] == pytest.approx(6.0)
    assert metrics["env/finish/terminated"] == 1.0

"""`rl_algos.trainer.cpu_plan`: the CPU settings' defaults fit together on a 2-core machine,
and a placement that cannot fit is refused on one line naming the fields, before Ray."""

from __future__ import annotations

import pytest

from rl_algos.config import load_config
from rl_algos.trainer.cpu_plan import plan_cpus
from rl_core.config import ConfigError

# the env section of docs/environments.md (its CPU-free part)
DOCS_ENV = {
    "name": "rl_core.testing.text_env:TwoTurnDigitEnv",
    "max_tokens_per_turn": 32,
    "val_episodes": 64,
    "num_workers": 2,
    "max_concurrency": 32,
    "step_timeout_s": 30,
    "episode_timeout_s": 300,
}


def cfg(env=DOCS_ENV, **trainer):
    data = {"model": {"path": "m"}, "trainer": {"num_workers": 1, **trainer}}
    if env is None:
        data["data"] = {"train_files": ["t.jsonl"]}
    if env is not None:
        data["env"] = dict(env)
    return load_config(data)


def test_the_docs_env_section_fits_two_cores_with_no_cpu_settings():
    plan = plan_cpus(cfg(), 2.0)
    # one CPU for the training worker, the other shared by the two environment workers
    assert plan.env_workers == 2
    assert plan.env_cpus_per_worker == 0.5
    assert plan.trainer_cpus_per_worker == 1.0
    assert plan.env_cpus + 1 * plan.trainer_cpus_per_worker <= 2.0


def test_the_issue_case_fits_too():
    """num_workers 1 each, ray_num_cpus 2: the case that failed at its first step."""
    plan = plan_cpus(cfg({**DOCS_ENV, "num_workers": 1}, ray_num_cpus=2), 2.0)
    assert (plan.env_cpus_per_worker, plan.trainer_cpus_per_worker) == (1.0, 1.0)


def test_larger_machines_give_the_training_workers_the_rest():
    plan = plan_cpus(cfg(num_workers=2), 16.0)
    # 2 training workers, 2 env workers each (colocated rollout): 4 env workers x 1 CPU
    assert plan.env_workers == 4 and plan.env_cpus_per_worker == 1.0
    assert plan.trainer_cpus_per_worker == 6.0  # (16 - 4) // 2
    three = plan_cpus(cfg({**DOCS_ENV, "num_workers": 3}), 2.0)
    assert three.env_cpus_per_worker == 0.33 and three.trainer_cpus_per_worker == 1.0


def test_without_env_nothing_changes():
    plan = plan_cpus(cfg(None), 2.0)
    assert plan.env_workers == 0 and plan.trainer_cpus_per_worker is None


def test_the_local_backend_places_nothing_on_ray():
    plan = plan_cpus(cfg(backend="local"), 2.0)
    assert plan.env_workers == 0


@pytest.mark.parametrize(
    "env_extra, trainer, fields",
    [
        ({"cpus_per_worker": 1}, {}, ["env.num_workers=2", "env.cpus_per_worker=1"]),
        ({}, {"cpus_per_worker": 2}, ["trainer.cpus_per_worker=2", "env.cpus_per_worker=null"]),
        ({}, {"num_workers": 2}, ["trainer.num_workers=2", "env.num_workers=2"]),
    ],
)
def test_a_placement_that_cannot_fit_is_one_line_naming_the_fields(env_extra, trainer, fields):
    with pytest.raises(ConfigError) as err:
        plan_cpus(cfg({**DOCS_ENV, **env_extra}, **trainer), 2.0)
    message = str(err.value)
    assert "\n" not in message and message.startswith("trainer.ray_num_cpus")
    for field in fields:
        assert field in message, message
    assert "2 CPUs" in message


def test_refused_before_ray_starts(monkeypatch):
    """`start_role_groups` checks the plan before it connects to Ray."""
    import rl_core.single_controller.ray as ray_backend
    from rl_algos.trainer import placement

    def no_ray(*a, **k):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(ray_backend, "ensure_ray", no_ray)
    monkeypatch.setattr(placement, "actor_worker_config", lambda *a: _Args())
    bad = cfg({**DOCS_ENV, "cpus_per_worker": 1}, ray_num_cpus=2)
    with pytest.raises(ConfigError, match=r"env\.cpus_per_worker=1"):
        placement.start_role_groups(bad, "m")


class _Args:
    ref = None


def test_the_teacher_and_judge_pools_are_counted():
    """A split teacher's processes count like a split critic's; the judge's replicas come
    on top of ``trainer.ray_num_cpus``, like a split rollout pool's (rounded up)."""
    from rl_algos.trainer.cpu_plan import expected_cluster_cpus, rollout_pool_cpus

    data = {"model": {"path": "m"}, "data": {"train_files": ["t.jsonl"]},
            "distill": {"teacher_path": "t", "num_workers": 2},
            "reward": {"judge": {"model_path": "j", "num_replicas": 3, "cpus_per_replica": 0.5}},
            "trainer": {"num_workers": 1, "ray_num_cpus": 2, "cpus_per_worker": 1}}  # fmt: skip
    config = load_config(data)
    assert rollout_pool_cpus(config) == 1.5
    assert expected_cluster_cpus(config) == 4.0  # 2 + ceil(1.5)
    with pytest.raises(ConfigError) as err:  # actor 1 + teacher 2 + judge 1.5 > 4
        plan_cpus(config, 4.0)
    assert "distill.num_workers=2" in str(err.value) and "\n" not in str(err.value)
    assert plan_cpus(config, 4.5).trainer_cpus_per_worker == 1.0
    data["distill"]["placement"] = "colocated"  # in the actor's process: no CPU of its own
    assert plan_cpus(load_config(data), 2.5).trainer_cpus_per_worker == 1.0

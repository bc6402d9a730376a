"""The docs' GuessEnv (docs/environments.md) with the docs' `env` section trains through
`rl train`'s trainer on the Ray backend with no CPU setting given (`trainer.ray_num_cpus`,
`trainer.cpus_per_worker`, `env.cpus_per_worker` all default) on this machine: the
environment workers and the training worker share the CPUs (`rl_algos.trainer.cpu_plan`).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

DOC = Path(__file__).resolve().parents[2] / "docs" / "environments.md"
pytestmark = [pytest.mark.timeout(600)]


@pytest.fixture
def docs_env(tmp_path, monkeypatch):
    text = DOC.read_text()
    code = re.search(r"```python\n(# my_envs/guess.py\n.*?)```", text, re.DOTALL).group(1)
    (tmp_path / "my_envs").mkdir()
    (tmp_path / "my_envs" / "__init__.py").write_text("")
    (tmp_path / "my_envs" / "guess.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{':'.join(sys.path)}")
    return yaml.safe_load(re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)[0])["env"]


def test_the_docs_guess_env_trains_on_ray_with_no_cpu_settings(docs_env, tmp_path):
    from rl_algos.config import load_config
    from rl_algos.trainer.loop import RLTrainer

    assert "cpus_per_worker" not in docs_env and docs_env["num_workers"] == 2
    env = {**docs_env, "val_episodes": 0}
    cfg = load_config(
        {
            "model": {"path": "tiny-random:qwen2"},
            "data": {"max_prompt_length": 64, "max_response_length": 96, "train_batch_size": 2},
            "env": env,
            "algorithm": {"preset": "grpo"},
            "rollout": {"n": 2},
            "actor": {"mini_batch_size": 2},
            "trainer": {
                "output_dir": str(tmp_path / "run"),
                "total_steps": 1,
                "num_workers": 1,
                "progress_bar": False,
                "loggers": ["jsonl"],
                "save_every": 0,
                "val_every": 0,
            },
        }
    )
    assert cfg.trainer.backend == "ray" and cfg.trainer.ray_num_cpus is None
    assert cfg.trainer.cpus_per_worker is None and cfg.env.cpus_per_worker is None
    trainer = RLTrainer(cfg)
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    step = [h for h in history if "env/episodes" in h]
    assert len(step) == 1 and step[0]["env/episodes"] == 4
    assert step[0]["env/failed_episodes"] == 0

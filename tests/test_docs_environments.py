"""docs/environments.md: the "own class" example is real code that passes the text
environment conformance suite, and the YAML blocks load as configs."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import yaml

from rl_core.testing.text_env import TextEnvConformance

DOC = Path(__file__).resolve().parents[1] / "docs" / "environments.md"
TEXT = DOC.read_text()
_root = Path(tempfile.mkdtemp(prefix="docs-envs-"))
(_root / "my_envs").mkdir()
(_root / "my_envs" / "__init__.py").write_text("")
_code = re.search(r"```python\n(# my_envs/guess.py\n.*?)```", TEXT, re.DOTALL).group(1)
(_root / "my_envs" / "guess.py").write_text(_code)
sys.path.insert(0, str(_root))


class TestDocumentedGuessEnv(TextEnvConformance):
    env_name = "my_envs.guess:GuessEnv"
    env_options = {"high": 20}
    model_turns = ["10", "5", "7"]


def test_the_example_is_about_twenty_lines():
    lines = [line for line in _code.splitlines() if line.strip() and not line.startswith("#")]
    assert len(lines) <= 24


def test_the_guess_env_plays_as_described():
    from my_envs.guess import GuessEnv

    from rl_core.text_env import ModelTurn

    env = GuessEnv(high=20)
    env.reset({}, seed=3)
    secret = env.secret
    assert secret > 1
    low = env.step(ModelTurn("I say 1", [1], turn=1))
    assert low.messages[0]["content"] == "Higher." and low.reward == 0.0 and not low.done
    hit = env.step(ModelTurn(f"It is {secret}!", [1], turn=2))
    assert hit.reward == 1.0 and hit.terminated
    env.reset({}, seed=3)
    for k in range(1, 4):
        step = env.step(ModelTurn("no idea", [1], turn=k))
    assert step.truncated and step.messages[0]["content"] == "Say a number."


def test_the_yaml_blocks_are_valid_env_sections():
    from rl_algos.config import load_config

    blocks = re.findall(r"```yaml\n(.*?)```", TEXT, re.DOTALL)
    assert len(blocks) == 2
    for block in blocks:
        env = yaml.safe_load(block)["env"]
        for spec in env.get("mix", []):
            if spec["name"].startswith("reasoning_gym:"):  # an adapter of rl-rollout's extra
                spec["name"] = "my_envs.guess:GuessEnv"
        cfg = load_config({"model": {"path": "m"}, "env": env})
        assert cfg.env.specs[0].name == "my_envs.guess:GuessEnv"

"""Tool RL settings from the trainer's config: the tools' schemas reach the prompts' chat
template, and every agent-loop setting reaches the rollout's validated config."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rl_algos.config import load_config
from rl_algos.trainer.model_source import resolve_model_path
from rl_algos.trainer.placement import actor_worker_config
from rl_algos.trainer.run_setup import prompt_template_kwargs

ROOT = Path(__file__).resolve().parents[2]
TOOL_OVERRIDES = [
    "rollout.agent_loop=tool",
    "rollout.tools={python: {max_concurrency: 2}}",
    "rollout.tool_parser=hermes",
    "rollout.tool_timeout_s=7.5",
    "rollout.tool_response_truncation=right",
    "rollout.max_turns=3",
    "rollout.chat_template_kwargs={enable_thinking: false}",
]
# renders the tools like the Qwen/Hermes templates do: as JSON in the system turn
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    "{% if enable_thinking is defined and not enable_thinking %}NOTHINK{% endif %}"
)


def _config(tmp_path, extra=()):
    return load_config(
        str(ROOT / "examples" / "grpo_tiny.yaml"),
        [f"trainer.output_dir={tmp_path}", *TOOL_OVERRIDES, *extra],
    )


def test_agent_loop_settings_reach_the_rollout_config(tmp_path):
    from rl_rollout.generator import manager_config_from_dict

    cfg = _config(tmp_path)
    model_path = resolve_model_path(cfg.model.path)
    manager = actor_worker_config(cfg, model_path, 0).rollout  # what the worker gets
    assert manager == manager_config_from_dict(dataclasses.asdict(manager))  # typed, checked
    assert manager.agent_loop == "tool"
    assert manager.tools == {"python": {"max_concurrency": 2}}
    loop = manager.loop
    assert (loop.tool_parser, loop.tool_timeout_s, loop.tool_response_truncation) == (
        "hermes",
        7.5,
        "right",
    )
    assert loop.max_turns == 3 and loop.chat_template_kwargs == {"enable_thinking": False}


def test_tool_schemas_go_into_the_prompt_template(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from rl_algos.data import PromptDataset

    cfg = _config(tmp_path)
    kwargs = prompt_template_kwargs(cfg)
    (schema,) = kwargs["tools"]
    assert schema["type"] == "function" and schema["function"]["name"] == "python"
    assert "code" in schema["function"]["parameters"]["properties"]
    assert kwargs["enable_thinking"] is False

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg.model.path))
    tokenizer.chat_template = TOOLS_TEMPLATE
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        '{"prompt": [{"role": "user", "content": "2+3?"}], "data_source": "arithmetic", '
        '"reward_model": {"ground_truth": "5"}}\n'
    )
    dataset = PromptDataset(
        [str(rows)], tokenizer=tokenizer, max_prompt_length=4096, chat_template_kwargs=kwargs
    )
    text = tokenizer.decode(dataset[0]["raw_prompt_ids"])
    assert '"name": "python"' in text and text.endswith("assistant\nNOTHINK")


def test_tool_loop_settings_are_checked_before_ray_starts(tmp_path):
    import pytest

    from rl_algos.config import check_plugins
    from rl_algos.errors import ConfigError

    check_plugins(_config(tmp_path))  # the valid tool-loop config passes
    cases = [
        (
            ["rollout.tool_parser=hermez"],
            r"rollout\.tool_parser: invalid value 'hermez'.*"
            r"did you mean 'hermes'\?",
        ),
        (
            ["rollout.agent_loop=single_turn"],
            r"rollout\.agent_loop: invalid value 'single_turn'; expected 'tool' .*"
            r"with rollout\.tools=\['python'\]",
        ),
    ]
    for extra, message in cases:
        with pytest.raises(ConfigError, match=message):
            check_plugins(_config(tmp_path, extra))
    no_tools = _config(tmp_path)
    no_tools.rollout.tools = {}  # (an override merges into the dict, cannot empty it)
    with pytest.raises(
        ConfigError,
        match=r"rollout\.tools: invalid value \{\}; expected at least one tool with rollout\.agent_loop='tool'",
    ):
        check_plugins(no_tools)
    for extra, message in (
        (["rollout.tool_timeout_s=0"], r"rollout\.tool_timeout_s: invalid value 0"),
        (["rollout.max_turns=0"], r"rollout\.max_turns: invalid value 0"),
        (["rollout.tool_response_truncation=top"], r"rollout\.tool_response_truncation"),
    ):
        with pytest.raises(ConfigError, match=message):
            _config(tmp_path, extra)
    # a tool's own arguments are checked when its schema is rendered into the prompts
    bad = _config(tmp_path, ["rollout.tools={python: {max_concurrency: 0}}"])
    with pytest.raises(
        ConfigError, match=r"^rollout\.tools\.python\.max_concurrency: invalid value 0; expected"
    ):
        prompt_template_kwargs(bad)
    bad = _config(tmp_path, ["rollout.tools={python: {max_concurency: 2}}"])
    with pytest.raises(ConfigError, match=r"rollout\.tools\.python\.max_concurency: unknown key"):
        prompt_template_kwargs(bad)

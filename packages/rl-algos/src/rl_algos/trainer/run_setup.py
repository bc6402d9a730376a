"""What the trainer sets up before its first step: the generated task's files, the seeds,
the user's reward function, DAPO's overlong buffer, the tools' schemas and the prompts'
chat-template arguments."""

from __future__ import annotations

import json
import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl_algos.errors import ConfigError

__all__ = [
    "materialize_generated_task",
    "overlong_buffer",
    "prompt_template_kwargs",
    "seed_everything",
    "tool_schemas",
    "user_reward_function",
]

log = logging.getLogger(__name__)


def materialize_generated_task(cfg: Any, output_dir: Path) -> None:
    """Write ``data.generate``'s task (options in ``generate.json``: other options
    regenerate, or are refused on resume) and point the data files at it."""
    gen = cfg.data.generate
    if gen.task is None:
        return
    from rl_algos.data import write_task

    out = output_dir / "data" / gen.task
    train, test, record = out / "train.parquet", out / "test.parquet", out / "generate.json"
    from rl_algos.config.schema import PLAIN_SPLIT_OPTIONS

    def tuples(opts: Any) -> dict[str, Any]:
        return {k: tuple(v) if isinstance(v, list) else v for k, v in dict(opts).items()}

    options = tuples(gen.options)
    wanted_split = {
        "task": gen.task,
        "train_size": gen.train_size,
        "test_size": gen.test_size,
        "seed": gen.seed,
        "options": options,
    }
    extra: dict[str, tuple[int, dict[str, Any]]] = {}
    if gen.plain_test_size:  # recorded only when asked for: older records stay valid
        plain = {**PLAIN_SPLIT_OPTIONS, **tuples(gen.plain_options)}
        extra["plain_test"] = (gen.plain_test_size, plain)
        wanted_split.update(plain_test_size=gen.plain_test_size, plain_options=plain)
    if gen.train_repeats:  # recorded only when true: older records stay valid
        wanted_split["train_repeats"] = True
    wanted = json.loads(json.dumps(wanted_split, sort_keys=True))
    have = json.loads(record.read_text()) if record.is_file() else None
    plain_file = out / "plain_test.parquet"
    files_there = train.exists() and test.exists() and (not extra or plain_file.exists())
    if not (files_there and have == wanted):
        if have is not None and cfg.trainer.resume:
            changed = sorted(k for k in wanted if have.get(k) != wanted[k])
            key = changed[0] if changed else ""
            raise ConfigError(
                f"data.generate.{key}" if key else "data.generate",
                f"the value this run was trained on, {have.get(key, have)!r} ({out}), when "
                "resuming (or a new trainer.output_dir)",
                value=wanted.get(key, wanted),
                problem="changed since the run started",
            )
        if have is not None:
            log.warning("data.generate changed (%s -> %s): regenerating %s", have, wanted, out)
        record.unlink(missing_ok=True)
        try:
            write_task(
                gen.task,
                out,
                gen.train_size,
                gen.test_size,
                gen.seed,
                extra_splits=extra,
                train_repeats=gen.train_repeats,
                **options,
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                "data.generate.options", f"options of task {gen.task!r} ({exc})", value=options
            ) from None
        tmp = record.with_suffix(".tmp")
        tmp.write_text(json.dumps(wanted, indent=1, sort_keys=True))
        os.replace(tmp, record)  # written last: files without it are regenerated
    cfg.data.train_files = [str(train)]
    if not cfg.data.val_files:
        cfg.data.val_files = [str(test)]
    if gen.plain_test_size:
        cfg.data.extra_val_files.setdefault("plain", [str(plain_file)])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def user_reward_function(reward_cfg: Any) -> Any:
    if not reward_cfg.function_path:
        return None
    from rl_algos.rewards import load_reward_function

    return load_reward_function(reward_cfg.function_path, reward_cfg.function_name)


def overlong_buffer(cfg: Any) -> Any:
    ol = cfg.algorithm.overlong
    if not ol.enabled:
        return None
    from rl_algos.rewards import OverlongBuffer

    return OverlongBuffer(
        length=ol.buffer_length,
        penalty_factor=ol.penalty_factor,
        max_response_length=cfg.data.max_response_length,
    )


def tool_schemas(tools: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-style schemas of the configured tools (built by name from ``rl.tools``)."""
    from rl_core.registry import Registry

    registry: Registry[Any] = Registry("rl.tools", kind="tool")
    schemas = []
    for name, kwargs in tools.items():
        tool_class = registry.get(name)
        parse = getattr(tool_class, "parse_options", None)
        try:
            if parse is not None:  # the tool's typed arguments: errors name the key
                parse(dict(kwargs))
            tool = tool_class(**dict(kwargs))
        except ConfigError as exc:
            raise exc.under(f"rollout.tools.{name}") from None
        except TypeError as exc:  # constructor arguments of a tool without options_class
            raise ConfigError(
                f"rollout.tools.{name}", f"the tool's constructor arguments ({exc})", value=kwargs
            ) from None
        schemas.append(tool.schema.to_openai())
    return schemas


def prompt_template_kwargs(cfg: Any) -> dict[str, Any]:
    """The prompts' chat-template arguments: ``data.chat_template_kwargs``, the rollout's,
    and the tools' schemas (``tools=``) when tools are configured, so the model sees them."""
    kwargs = {**dict(cfg.rollout.chat_template_kwargs), **dict(cfg.data.chat_template_kwargs)}
    if cfg.rollout.tools:
        kwargs["tools"] = tool_schemas(dict(cfg.rollout.tools))
    return kwargs

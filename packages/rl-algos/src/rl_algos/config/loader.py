"""Load the config: defaults, preset, one YAML file, `key=value` overrides.

Precedence: dataclass defaults < `algorithm.preset` < YAML < overrides. Mappings merge
key by key, except that an override ``key={}`` empties the mapping (e.g.
``actor.engine_kwargs={}`` drops an engine's options set in the YAML). Every mistake
raises `ConfigError` with the full key path, the value, what is allowed and, for typos,
the closest valid key or choice::

    actor.optim.lrr: unknown key 'lrr'; did you mean 'lr'? (actor.optim has: betas, eps, ...)
    actor.loss.agg_mode: invalid value 'token_mean'; expected one of [...]; did you mean 'token-mean'?

Names of engines and rollout backends come from other packages' entry points, so they
are checked when the trainer starts (`check_plugins`), not here.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rl_algos.advantages import ADVANTAGE_ESTIMATORS
from rl_algos.config.presets import PRESETS
from rl_algos.config.schema import RLConfig
from rl_algos.errors import ConfigError, suggest
from rl_algos.losses import POLICY_LOSSES
from rl_core.registry import Registry

__all__ = ["AGENT_LOOPS", "GROUP_ESTIMATORS", "check_plugins", "load_config"]

# The agent-loop registry lives in rl-rollout; this view of its entry point group lets the
# config check names without importing that package.
AGENT_LOOPS: Registry[Any] = Registry("rl.agent_loops", kind="agent loop")
TOOLS: Registry[Any] = Registry("rl.tools", kind="tool")
TOOL_PARSERS: Registry[Any] = Registry("rl.tool_parsers", kind="tool-call parser")

# Estimators whose baseline is computed within the samples of one prompt.
GROUP_ESTIMATORS = (
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_plus_plus_baseline",
    "opo",
    "gpg",
    "grpo_passk",
)


_SECTION_ALIASES = {"async": "async_"}  # YAML section -> field (a Python keyword)
_YAML_NAMES = {v: k for k, v in _SECTION_ALIASES.items()}


def _join(path: str, key: str) -> str:
    key = _YAML_NAMES.get(key, key) if not path else key
    return f"{path}.{key}" if path else key


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass a field holds (also through `X | None`), else None."""
    if dataclasses.is_dataclass(hint):
        return hint  # type: ignore[return-value]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        found = [a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)]
        return found[0] if found else None
    return None


def _check_keys(data: Any, cls: type, path: str) -> None:
    """Unknown keys and sections that are not mappings, with the full path."""
    if not isinstance(data, Mapping):
        where = path or "the config"
        raise ConfigError(
            path, f"expected a mapping of {cls.__name__} fields for {where}, got {data!r}"
        )
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key, value in data.items():
        if key not in names:
            raise ConfigError(
                _join(path, str(key)),
                f"unknown key {key!r}{suggest(str(key), names)} "
                f"({path or 'the top level'} has: {', '.join(names)})",
            )
        sub = _dataclass_in(hints[key])
        if sub is not None and value is not None:
            _check_keys(value, sub, _join(path, key))


_TYPE_WORDS = {"Float": "a number", "Integer": "an integer", "Boolean": "true or false"}


def _from_omegaconf(exc: OmegaConfBaseException) -> ConfigError:
    key = str(getattr(exc, "full_key", "") or "")
    head, _, rest = key.partition(".")
    key = ".".join(filter(None, [_YAML_NAMES.get(head, head), rest]))
    value = getattr(exc, "value", None)
    message = str(getattr(exc, "msg", None) or exc).split("\n")[0]
    choices = re.search(r"expected one of \[(.*)\]", message)
    if choices:
        allowed = [c.strip().strip("'\"") for c in choices.group(1).split(",")]
        return ConfigError(
            key, f"invalid value {value!r}; expected one of {allowed}{suggest(str(value), allowed)}"
        )
    converted = re.search(r"could not be converted to (\w+)", message)
    if converted:
        expected = _TYPE_WORDS.get(converted.group(1), converted.group(1).lower())
        return ConfigError(key, f"invalid value {value!r}; expected {expected}")
    if "is not Optional" in message:
        return ConfigError(key, "invalid value None; this field needs a value")
    return ConfigError(key, f"invalid value {value!r}: {message}")


def _instantiate(cls: type, data: Mapping[str, Any], path: str) -> Any:
    """Build the dataclass tree from validated plain data; field checks name the path."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        value = data[f.name]
        sub = _dataclass_in(hints[f.name])
        if sub is not None and isinstance(value, Mapping):
            value = _instantiate(sub, value, _join(path, f.name))
        elif typing.get_origin(hints[f.name]) is tuple and isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    try:
        obj = cls(**kwargs)
    except ConfigError as exc:
        raise exc.under(path) from None
    validate = getattr(obj, "validate", None)
    if validate is not None:  # rl-core's engine configs check themselves
        probe = obj
        if getattr(obj, "total_steps", 0) is None:  # the trainer sets it from trainer.total_steps
            probe = dataclasses.replace(obj, total_steps=1)
        try:
            validate.__func__(probe)
        except ValueError as exc:  # "OptimizerConfig.lr=-1 is invalid: expected ..."
            text = str(exc)
            found = re.match(rf"{cls.__name__}\.(\w+)=(.*) is invalid: expected (.*)", text, re.S)
            if found is None:
                raise ConfigError(path, text) from None
            field, value, expected = found.groups()
            raise ConfigError(
                _join(path, field), f"invalid value {value}; expected {expected}"
            ) from None
    return obj


def _check_consistency(cfg: RLConfig) -> None:
    """Rules that span fields; fills the derived defaults."""
    if not cfg.model.path:
        raise ConfigError(
            "model.path",
            "missing; expected a Hugging Face model directory, gguf:<file or package>, or "
            "smollm2-135m-instruct",
        )
    generate = cfg.data.generate
    if generate.task is not None:
        from rl_algos.data.tasks import GENERATED_TASKS, TASKS

        tasks = sorted(TASKS) + GENERATED_TASKS.names()
        if generate.task not in tasks:
            raise ConfigError(
                "data.generate.task",
                f"invalid value {generate.task!r}; expected one of {tasks}"
                f"{suggest(generate.task, tasks)}",
            )
        if cfg.data.train_files:
            raise ConfigError(
                "data.train_files",
                "set together with data.generate.task: expected one source of prompts",
            )
    elif not cfg.data.train_files:
        raise ConfigError(
            "data.train_files",
            "empty; expected a list of parquet/jsonl files (or data.generate.task)",
        )
    if cfg.data.train_batch_size % cfg.actor.mini_batch_size:
        raise ConfigError(
            "actor.mini_batch_size",
            f"invalid value {cfg.actor.mini_batch_size}; expected a divisor of "
            f"data.train_batch_size={cfg.data.train_batch_size}",
        )
    for key, value, registry in (
        ("algorithm.adv_estimator", cfg.algorithm.adv_estimator, ADVANTAGE_ESTIMATORS),
        ("actor.loss.name", cfg.actor.loss.name, POLICY_LOSSES),
    ):
        names = registry.names()
        if value not in names:
            raise ConfigError(
                key, f"invalid value {value!r}; expected one of {names}{suggest(value, names)}"
            )
    alg = cfg.algorithm
    if alg.adv_estimator in GROUP_ESTIMATORS and cfg.rollout.n < 2:
        raise ConfigError(
            "rollout.n",
            f"invalid value {cfg.rollout.n}; algorithm.adv_estimator={alg.adv_estimator!r} "
            "compares samples of one prompt: expected >= 2",
        )
    if alg.dynamic_sampling.enabled and (alg.adv_estimator not in GROUP_ESTIMATORS):
        raise ConfigError(
            "algorithm.dynamic_sampling.enabled",
            f"dynamic sampling filters prompt groups: expected adv_estimator in {list(GROUP_ESTIMATORS)}, "
            f"got {alg.adv_estimator!r}",
        )
    max_len = cfg.data.max_response_length
    if alg.overlong.enabled:
        if alg.overlong.buffer_length is None:
            alg.overlong.buffer_length = max(1, max_len // 4)
        if alg.overlong.buffer_length > max_len:
            raise ConfigError(
                "algorithm.overlong.buffer_length",
                f"invalid value {alg.overlong.buffer_length}; expected <= data.max_response_length={max_len}",
            )
    for loss in (cfg.actor.loss, cfg.critic.loss):
        if loss.agg_norm_constant is None:
            loss.agg_norm_constant = float(max_len)
    _check_async(cfg)


def _check_async(cfg: RLConfig) -> None:
    """Resolve `async.correction` into the actor loss (one place decides it)."""
    a = cfg.async_
    if a.correction == "auto":
        a.correction = "decoupled_ppo" if a.max_staleness > 0 else "none"
    loss = cfg.actor.loss
    if a.correction == "decoupled_ppo":
        if loss.tis_cap is not None:
            raise ConfigError(
                "actor.loss.tis_cap",
                f"set ({loss.tis_cap}) together with async.correction=decoupled_ppo: expected "
                "one off-policy correction (use async.correction=tis for truncated IS)",
            )
        loss.behav_imp_weight_cap = a.imp_weight_cap
    elif a.correction == "tis" and loss.tis_cap is None:
        loss.tis_cap = a.imp_weight_cap


def _as_dict(source: str | Path | Mapping[str, Any] | None) -> DictConfig:
    if source is None:
        return OmegaConf.create({})
    if isinstance(source, Mapping):
        return OmegaConf.create(dict(source))
    path = Path(source).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    try:
        loaded = OmegaConf.load(path)
    except Exception as exc:
        raise ConfigError("", f"{path}: not valid YAML: {exc}") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError("", f"{path}: expected a mapping of sections at the top level")
    return loaded


def _overrides(items: Sequence[str]) -> DictConfig:
    for item in items:
        key = item.split("=", 1)[0]
        if "=" not in item or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", key):
            raise ConfigError(
                "",
                f"override {item!r}: expected key=value with a dotted key, e.g. actor.optim.lr=1e-6",
            )
    try:
        return OmegaConf.from_dotlist(list(items))
    except OmegaConfBaseException as exc:
        raise ConfigError("", f"could not parse the overrides {list(items)}: {exc}") from None


def _emptied_mappings(items: Sequence[str]) -> list[str]:
    """Keys of the overrides ``key={}``: they replace the mapping instead of merging."""
    return [item.split("=", 1)[0] for item in items if item.split("=", 1)[1].strip() == "{}"]


def _python_names(merged: DictConfig) -> DictConfig:
    """Rename sections whose YAML name is a Python keyword (``async`` -> ``async_``)."""
    data = OmegaConf.to_container(merged, resolve=False)
    for yaml_name, field_name in _SECTION_ALIASES.items():
        if yaml_name in data:
            if field_name in data:
                raise ConfigError(yaml_name, f"given twice (as {yaml_name!r} and {field_name!r})")
            data[field_name] = data.pop(yaml_name)
    return OmegaConf.create(data)


def load_config(
    source: str | Path | Mapping[str, Any] | None = None, overrides: Sequence[str] = ()
) -> RLConfig:
    """The validated config from a YAML file (or a mapping, or nothing) and overrides."""
    base, extra = _as_dict(source), _overrides(overrides)
    preset = OmegaConf.select(extra, "algorithm.preset", default=None)
    if preset is None:
        preset = OmegaConf.select(base, "algorithm.preset", default=None)
    layers = [base, extra]
    if preset is not None:
        if preset not in PRESETS:
            names = sorted(PRESETS)
            raise ConfigError(
                "algorithm.preset",
                f"invalid value {preset!r}; expected one of {names}{suggest(str(preset), names)}",
            )
        layers.insert(0, OmegaConf.create(PRESETS[preset]))
    try:
        merged = OmegaConf.merge(*layers)
        for key in _emptied_mappings(overrides):
            OmegaConf.update(merged, key, {}, merge=False)
        merged = _python_names(merged)
        _check_keys(OmegaConf.to_container(merged, resolve=False), RLConfig, "")
        typed = OmegaConf.merge(OmegaConf.structured(RLConfig), merged)
        data = OmegaConf.to_container(typed, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        raise _from_omegaconf(exc) from None
    cfg = _instantiate(RLConfig, data, "")
    _check_consistency(cfg)
    return cfg


def check_plugins(cfg: RLConfig) -> None:
    """Check the names that other packages provide (engines, rollout backends, sequence
    generators, agent loops, tools, datasets) against what is installed; call before Ray
    starts."""
    from rl_algos.data.dataset import DATASETS
    from rl_core.engine import ENGINES
    from rl_core.rollout import ROLLOUTS, SEQUENCE_GENERATORS

    checks = [
        ("data.dataset", cfg.data.dataset, DATASETS, "rl-multimodal"),
        ("actor.engine", cfg.actor.engine, ENGINES, "rl-engines[fsdp]"),
        ("rollout.backend", cfg.rollout.backend, ROLLOUTS, "rl-rollout[hf]"),
        ("rollout.generator", cfg.rollout.generator, SEQUENCE_GENERATORS, "rl-rollout"),
        ("rollout.agent_loop", cfg.rollout.agent_loop, AGENT_LOOPS, "rl-rollout"),
    ]
    checks += [
        (f"rollout.tools.{name}", name, TOOLS, "rl-rollout") for name in dict(cfg.rollout.tools)
    ]
    if cfg.rollout.agent_loop != "single_turn":
        checks.append(("rollout.tool_parser", cfg.rollout.tool_parser, TOOL_PARSERS, "rl-rollout"))
    if cfg.uses_critic:
        checks.append(("critic.engine", cfg.critic.engine, ENGINES, "rl-engines[fsdp]"))
    if cfg.reward.model_path is not None:
        checks.append(("reward.model_engine", cfg.reward.model_engine, ENGINES, "rl-engines[fsdp]"))
    for key, name, registry, package in checks:
        names = registry.names()
        if name not in names:
            raise ConfigError(
                key,
                f"invalid value {name!r}: no {registry.kind} of that name is installed "
                f"(installed: {', '.join(names) or 'none'}; the built-in ones come with "
                f"pip install '{package}'){suggest(name, names)}",
            )
    _check_tool_loop(cfg)


def _check_tool_loop(cfg: RLConfig) -> None:
    """Tools and the agent loop must go together: the built-in single-turn loop never runs
    a tool (its schemas would still reach the prompts), the tool loop needs one."""
    rollout = cfg.rollout
    tools = sorted(dict(rollout.tools))
    if tools and rollout.agent_loop == "single_turn":
        raise ConfigError(
            "rollout.agent_loop",
            f"invalid value 'single_turn' with rollout.tools={tools}: the single-turn loop "
            "never runs a tool call; expected 'tool' (or an agent loop of your own)",
        )
    if not tools and rollout.agent_loop == "tool":
        raise ConfigError(
            "rollout.tools",
            "empty with rollout.agent_loop='tool'; expected at least one tool, e.g. "
            "rollout.tools={python: {}}",
        )

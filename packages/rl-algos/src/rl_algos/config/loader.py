"""Load the config: defaults, preset, one YAML file, `key=value` overrides.

Precedence: dataclass defaults < `algorithm.preset` < YAML < overrides. Mappings merge key
by key; an override ``key={}`` empties one. Mistakes raise `ConfigError` with the key path,
the value, what is allowed and the closest valid key. Plugin names are checked at start-up
(`check_plugins`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, OmegaConfBaseException

from rl_algos.advantages import ADVANTAGE_ESTIMATORS
from rl_algos.config.presets import PRESETS
from rl_algos.config.schema import RLConfig
from rl_algos.config.vla_section import VLA_ENVS, VLAConfig, is_vla_run
from rl_algos.errors import ConfigError
from rl_algos.losses import POLICY_LOSSES
from rl_algos.rollout_correction import RolloutCorrectionConfig
from rl_core.config import NOTHING, build, check
from rl_core.registry import Registry

__all__ = ["AGENT_LOOPS", "GROUP_ESTIMATORS", "check_plugins", "load_config"]

# a view of rl-rollout's agent-loop entry points (names checked without importing it)
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


def _missing(path: str, expected: str) -> ConfigError:
    return ConfigError(path, expected, problem="missing")


def _conflict(path: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(path, expected, value=value, problem="conflict")


def _one_of(path: str, value: Any, names: Sequence[str]) -> None:
    check(value in names, path, value, f"one of {list(names)}", names)


def _check_consistency(cfg: RLConfig) -> None:
    """Rules that span fields; fills the derived defaults."""
    if not cfg.model.path:
        raise _missing(
            "model.path",
            "a Hugging Face model directory, gguf:<file or package>, or smollm2-135m-instruct",
        )
    if is_vla_run(cfg):
        _check_vla(cfg)
        return
    if cfg.vla is not None:
        names = VLA_ENVS.names()
        raise _conflict("vla", "(a section)", f"no vla section unless env.name is a VLA "
                        f"environment ({', '.join(names) or 'none installed: rl-multimodal'})")  # fmt: skip
    generate = cfg.data.generate
    if cfg.env is not None:
        _check_text_env_run(cfg)
    elif generate.task is not None:
        from rl_algos.data.tasks import GENERATED_TASKS, TASKS

        _one_of("data.generate.task", generate.task, sorted(TASKS) + GENERATED_TASKS.names())
        if cfg.data.train_files:
            raise _conflict("data.train_files", cfg.data.train_files,
                            "one source of prompts: empty when data.generate.task is set")  # fmt: skip
    elif not cfg.data.train_files:
        raise _missing("data.train_files", "a list of parquet/jsonl files (or data.generate.task)")
    check(cfg.data.train_batch_size % cfg.actor.mini_batch_size == 0, "actor.mini_batch_size",
          cfg.actor.mini_batch_size,
          f"a divisor of data.train_batch_size={cfg.data.train_batch_size}")  # fmt: skip
    alg = cfg.algorithm
    _one_of("algorithm.adv_estimator", alg.adv_estimator, ADVANTAGE_ESTIMATORS.names())
    _one_of("actor.loss.name", cfg.actor.loss.name, POLICY_LOSSES.names())
    group = alg.adv_estimator in GROUP_ESTIMATORS
    check(not group or cfg.rollout.n >= 2, "rollout.n", cfg.rollout.n,
          f">= 2: algorithm.adv_estimator={alg.adv_estimator!r} compares samples of one "
          "prompt")  # fmt: skip
    check(not group or cfg.rollout.temperature > 0, "rollout.temperature",
          cfg.rollout.temperature,
          f"> 0 with algorithm.adv_estimator={alg.adv_estimator!r} and rollout.n="
          f"{cfg.rollout.n}: greedy sampling (0) makes the n samples of a prompt identical, "
          "so every advantage is 0")  # fmt: skip
    check(not alg.dynamic_sampling.enabled or group, "algorithm.dynamic_sampling.enabled",
          True, f"false unless algorithm.adv_estimator is one of {list(GROUP_ESTIMATORS)} "
          "(dynamic sampling filters prompt groups)")  # fmt: skip
    max_len = cfg.data.max_response_length
    if alg.overlong.enabled:
        if alg.overlong.buffer_length is None:
            alg.overlong.buffer_length = max(1, max_len // 4)
        check(alg.overlong.buffer_length <= max_len, "algorithm.overlong.buffer_length",
              alg.overlong.buffer_length, f"<= data.max_response_length={max_len}")  # fmt: skip
    reward = cfg.reward
    check(reward.rule_based or reward.model_path is not None or reward.judge.enabled
          or cfg.distill.enabled, "reward.rule_based", reward.rule_based,
          "true unless reward.model_path, reward.judge.model_path or distill.teacher_path is "
          "set (something must give the training signal)")  # fmt: skip
    key = cfg.distill.teacher_prompt_key
    check(key is None or cfg.distill.enabled, "distill.teacher_prompt_key", key,
          "null unless distill.teacher_path names the teacher that reads it")  # fmt: skip
    guide, reference = cfg.rollout.guide_prompt_key, cfg.rollout.reference_key
    not_generated = {"guide_prompt_key": "a guided sample's rollout log-probs and routing "
                     "belong to the guide's prompt, not to the prompt it trains on",
                     "reference_key": "a reference sample has no rollout log-probs or "
                     "routing (it is not generated)"}  # fmt: skip
    for name, why in not_generated.items():
        value = getattr(cfg.rollout, name)
        check(value is None or (cfg.actor.loss.rollout_correction is None
                                and cfg.async_.max_staleness == 0
                                and not cfg.actor.router_replay),
              f"rollout.{name}", value, "null with actor.loss.rollout_correction, "
              f"async.max_staleness > 0 or actor.router_replay: {why}")  # fmt: skip
    hot = cfg.rollout.guided_temperature
    check(hot is None or cfg.rollout.generator == "agent_loop", "rollout.guided_temperature",
          hot, "null with rollout.generator other than 'agent_loop' (rl-rollout's manager "
          "reads a row's own temperature; another generator may sample at the batch's)")  # fmt: skip
    cur = cfg.data.curriculum
    check(not cur.enabled or cur.score != "guided_gap" or guide or reference,
          "data.curriculum.score", cur.score, "'variance' or 'informative' without "
          "rollout.guide_prompt_key or rollout.reference_key ('guided_gap' compares guided "
          "or reference samples with the model's own)")  # fmt: skip
    for loss in (cfg.actor.loss, cfg.critic.loss):
        if loss.agg_norm_constant is None:
            loss.agg_norm_constant = float(max_len)
    _check_async(cfg)


def _check_text_env_run(cfg: RLConfig) -> None:
    """An LLM run with an ``env`` section: episodes and rewards come from the text
    environments, so no prompt files, no reward function and no greedy baseline."""
    from rl_core.text_env import is_text_env, text_env_names

    for key, value in (
        ("data.train_files", cfg.data.train_files),
        ("data.val_files", cfg.data.val_files),
        ("data.generate.task", cfg.data.generate.task),
        ("reward.function_path", cfg.reward.function_path),
        ("rollout.guide_prompt_key", cfg.rollout.guide_prompt_key),
        ("rollout.reference_key", cfg.rollout.reference_key),
    ):
        if value:
            raise _conflict(key, value, "empty with an env section: episodes and rewards "
                            "come from the environments")  # fmt: skip
    check(cfg.algorithm.adv_estimator != "remax", "algorithm.adv_estimator", "remax",
          "an estimator without a greedy baseline rollout with an env section")  # fmt: skip
    known = ", ".join(text_env_names()) or "none installed"
    for i, spec in enumerate(cfg.env.specs):
        key = "env.name" if cfg.env.name is not None else f"env.mix[{i}].name"
        check(is_text_env(spec.name), key, spec.name,
              f"a text environment (registered: {known}; or 'package.module:Class' naming a "
              "rl_core.text_env.TextEnv subclass)")  # fmt: skip


# Estimators a VLA run takes: outcome/return ones over the episode's steps.
VLA_ESTIMATORS = (
    "grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
)  # fmt: skip


def _check_vla(cfg: RLConfig) -> None:
    """A VLA run: episodes instead of prompts, the policy acting through a colocated rollout."""
    if cfg.vla is None:
        cfg.vla = VLAConfig()
    check(not cfg.data.train_files, "data.train_files", cfg.data.train_files,
          "empty in a VLA run (episodes come from env)")  # fmt: skip
    for key in ("guide_prompt_key", "reference_key"):  # prompt rows' columns
        check(getattr(cfg.rollout, key) is None, f"rollout.{key}", getattr(cfg.rollout, key),
              "null in a VLA run (episodes come from env, not prompt rows)")  # fmt: skip
    alg = cfg.algorithm.adv_estimator
    check(alg in VLA_ESTIMATORS, "algorithm.adv_estimator", alg,
          f"one of {list(VLA_ESTIMATORS)} in a VLA run (gae, PPO with the policy's value "
          "head, went with the VLA trainer in #40)", VLA_ESTIMATORS)  # fmt: skip
    check(cfg.rollout.placement == "colocated", "rollout.placement", cfg.rollout.placement,
          "'colocated' in a VLA run (the policy acts in the actor's processes)")  # fmt: skip
    if cfg.rollout.generator == "agent_loop":  # the default: the VLA policy's generator
        cfg.rollout.generator = "vla"
    check(alg not in GROUP_ESTIMATORS or cfg.rollout.n >= 2, "rollout.n", cfg.rollout.n,
          f">= 2: {alg} compares the episodes of one start state")  # fmt: skip
    check(cfg.env is not None and cfg.env.name is not None, "env.mix", "(a mix)",
          "one VLA environment (env.name) per run")  # fmt: skip
    check(cfg.rollout.placement == "colocated", "rollout.placement", cfg.rollout.placement,
          "'colocated' in a VLA run (actions come from the actor's worker processes)")  # fmt: skip
    for loss in (cfg.actor.loss, cfg.critic.loss):
        if loss.agg_norm_constant is None:
            loss.agg_norm_constant = 1.0


def _check_async(cfg: RLConfig) -> None:
    """Resolve `actor.loss.rollout_correction` (null with async: decoupled PPO, cap 2);
    refuse what cannot use it."""
    loss = cfg.actor.loss
    if loss.rollout_correction is None and cfg.async_.max_staleness > 0:
        loss.rollout_correction = RolloutCorrectionConfig.decoupled_ppo(2.0)
    corr = loss.rollout_correction
    if corr is None or not corr.rejects:
        return
    where = "actor.loss.rollout_correction"
    check(cfg.actor.recompute_old_log_probs is not False, "actor.recompute_old_log_probs",
          False, f"null or true with {where} rejecting (rollout_rs or the veto): rejection "
          "needs the old log-probs before the update")  # fmt: skip
    token_rs = [o for o in corr.rs_bounds if o.startswith("token")]
    estimator = cfg.algorithm.adv_estimator
    check(not (token_rs and estimator == "gae"), f"{where}.rollout_rs", corr.rollout_rs,
          f"sequence-level options (seq_*) with algorithm.adv_estimator={estimator!r}: GAE "
          f"skips masked tokens, so {token_rs} would drop the rewards of rejected "
          "tokens")  # fmt: skip


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
        first = " ".join(str(exc).split())
        raise ConfigError(str(path), f"valid YAML ({first})", problem="not valid YAML") from None
    check(isinstance(loaded, DictConfig), str(path), type(loaded).__name__,
          "a mapping of sections at the top level")  # fmt: skip
    return loaded


def _overrides(items: Sequence[str]) -> DictConfig:
    for item in items:
        key = item.split("=", 1)[0]
        check("=" in item and re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", key) is not None,
              "overrides", item, "key=value with a dotted key, e.g. actor.optim.lr=1e-6")  # fmt: skip
    try:
        return OmegaConf.from_dotlist(list(items))
    except OmegaConfBaseException as exc:
        first = " ".join(str(exc).split())
        raise ConfigError("overrides", f"key=value pairs ({first})", value=list(items)) from None


def _emptied_mappings(items: Sequence[str]) -> list[str]:
    """Keys of the overrides ``key={}``: they replace the mapping instead of merging."""
    return [item.split("=", 1)[0] for item in items if item.split("=", 1)[1].strip() == "{}"]


def _resolved(merged: DictConfig) -> dict[str, Any]:
    """Plain data with every ``${...}`` interpolation resolved."""
    try:
        return OmegaConf.to_container(merged, resolve=True)  # type: ignore[return-value]
    except InterpolationResolutionError as exc:
        raise ConfigError(
            str(exc.full_key or ""),
            "an interpolation of an existing key, e.g. ${trainer.run_name}",
            value=exc.value if exc.value is not None else NOTHING,
            problem="unresolvable interpolation",
        ) from None


def load_config(
    source: str | Path | Mapping[str, Any] | None = None, overrides: Sequence[str] = ()
) -> RLConfig:
    """The validated config from a YAML file (or a mapping, or nothing) and overrides."""
    base, extra = _as_dict(source), _overrides(overrides)
    preset = OmegaConf.select(extra, "algorithm.preset", default=None)
    if preset is None:
        preset = OmegaConf.select(base, "algorithm.preset", default=None)
    # the defaults take part so that their ${...} interpolations resolve too
    layers = [OmegaConf.create(RLConfig().to_dict()), base, extra]
    if preset is not None:
        _one_of("algorithm.preset", preset, sorted(PRESETS))
        layers.insert(1, OmegaConf.create(PRESETS[preset]))
    merged = OmegaConf.merge(*layers)
    for key in _emptied_mappings(overrides):
        OmegaConf.update(merged, key, {}, merge=False)
    cfg = build(RLConfig, _resolved(merged), "")
    _check_consistency(cfg)
    return cfg


def check_plugins(cfg: RLConfig) -> None:
    """Check plugin names (engines, rollout backends, generators, agent loops, tools,
    datasets) against what is installed, before Ray starts."""
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
    if cfg.reward.judge.enabled:
        checks.append(
            ("reward.judge.backend", cfg.reward.judge.backend, ROLLOUTS, "rl-rollout[hf]")
        )
    if cfg.distill.enabled:
        checks.append(("distill.teacher_engine", cfg.distill.teacher_engine, ENGINES,
                       "rl-engines[fsdp]"))  # fmt: skip
    for key, name, registry, package in checks:
        names = registry.names()
        check(name in names, key, name,
              f"an installed {registry.kind} ({', '.join(names) or 'none'}; the built-in ones "
              f"come with pip install '{package}')", names)  # fmt: skip
    _check_tool_loop(cfg)


def _check_tool_loop(cfg: RLConfig) -> None:
    """Tools and the agent loop must go together: the built-in single-turn loop never runs
    a tool (its schemas would still reach the prompts), the tool loop needs one."""
    rollout = cfg.rollout
    tools = sorted(dict(rollout.tools))
    check(not (tools and rollout.agent_loop == "single_turn"), "rollout.agent_loop",
          rollout.agent_loop, f"'tool' (or an agent loop of your own) with rollout.tools="
          f"{tools}: the single-turn loop never runs a tool call")  # fmt: skip
    check(
        bool(tools) or rollout.agent_loop != "tool",
        "rollout.tools",
        {},
        "at least one tool with rollout.agent_loop='tool', e.g. rollout.tools={python: {}}",
    )

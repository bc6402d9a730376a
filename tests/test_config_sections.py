"""One typed configuration path: a wrong type or an unknown key at any depth of every
section gives one `ConfigError` with the full dotted path, before any worker starts.

The sections' own keys are checked by `load_config`; the engines', rollout backends' and
tools' options by the classes they declare, when the driver builds the workers' typed
configs (`rl_algos.trainer.placement`) or the tools' schemas (before Ray starts).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_algos.config import check_plugins, load_config
from rl_algos.trainer.placement import actor_worker_config, critic_worker_config
from rl_algos.trainer.run_setup import tool_schemas
from rl_core.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "grpo_tiny.yaml")


def _error(overrides: list[str], stage: str = "load") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        cfg = load_config(TINY, overrides)
        check_plugins(cfg)
        if stage == "workers":
            actor_worker_config(cfg, "/models/m", 0)
            if cfg.uses_critic:
                critic_worker_config(cfg, "/models/m")
        elif stage == "tools":
            tool_schemas(cfg.rollout.tools)
    err = info.value
    assert "\n" not in str(err) and str(err).startswith(f"{err.path}: ")
    return err


@pytest.mark.parametrize(
    ("overrides", "path", "value"),
    [
        (["trainer.total_steps=two"], "trainer.total_steps", "two"),
        (["trainer.loggers=[console,jsnol]"], "trainer.loggers[1]", "jsnol"),
        (["trainer.seedd=1"], "trainer.seedd", None),
        (["trainer.placement=split"], "trainer.placement", None),  # renamed
    ],
)
def test_trainer_section(overrides, path, value):
    err = _error(overrides)
    assert err.path == path and (value is None or err.value == value)


@pytest.mark.parametrize(
    ("overrides", "path", "value"),
    [
        (["rollout.temperature=hot"], "rollout.temperature", "hot"),
        (["rollout.tools={python: {}}", "rollout.agent_loop=tool", "rollout.max_turns=0"],
         "rollout.max_turns", 0),
        (["rollout.stop_token_ids=[2,x]"], "rollout.stop_token_ids[1]", "x"),
        (["rollout.placment=split"], "rollout.placment", None),
        (["rollout.engine_kwargs={batch_wait_ms: -1}"], "rollout.engine_kwargs.batch_wait_ms", -1.0),
        (["rollout.engine_kwargs={device: 3}"], "rollout.engine_kwargs.device", 3),
        (["rollout.engine_kwargs={load_fromat: dummy}"], "rollout.engine_kwargs.load_fromat", None),
    ],
)  # fmt: skip
def test_rollout_section_and_backend_options(overrides, path, value):
    err = _error(overrides, stage="workers")
    assert err.path == path and (value is None or err.value == value)
    if path.endswith("load_fromat"):
        assert err.suggestion == "load_format"


@pytest.mark.parametrize(
    ("overrides", "path", "value"),
    [
        (["actor.engine_kwargs={logprob_chunk_tokens: -5}"],
         "actor.engine_kwargs.logprob_chunk_tokens", -5),
        (["actor.engine_kwargs={share_prompt: true}"], "actor.engine_kwargs.share_prompt", None),
        (["actor.engine_kwargs={moe_aux_loss_coeff: big}"],
         "actor.engine_kwargs.moe_aux_loss_coeff", "big"),
        (["algorithm.preset=ppo", "critic.engine_kwargs={use_remove_padding: maybe}"],
         "critic.engine_kwargs.use_remove_padding", "maybe"),
        (["actor.parallel.fsdp_size=zero"], "actor.parallel.fsdp_size", "zero"),
        (["actor.micro_batch_size=2", "actor.max_tokens_per_micro_batch=64"],
         "actor.micro_batch.max_tokens_per_micro_batch", 64),
        # a layout that does not divide the trainer's 2 workers
        (["actor.parallel.tensor_parallel_size=3"], "actor.parallel.tensor_parallel_size", 3),
        (["actor.parallel.fsdp_size=4"], "actor.parallel.fsdp_size", 4),
    ],
)  # fmt: skip
def test_engine_options(overrides, path, value):
    err = _error(overrides, stage="workers")
    assert err.path == path and (value is None or err.value == value)


@pytest.mark.parametrize(
    ("tool", "path", "value"),
    [
        ("{config: {memory_mb: lots}}", "rollout.tools.python.config.memory_mb", "lots"),
        ("{config: {memory_mb: 1}}", "rollout.tools.python.config.memory_mb", 1),
        ("{config: {backend: docker}}", "rollout.tools.python.config.backend", "docker"),
        ("{config: {alow_network: true}}", "rollout.tools.python.config.alow_network", None),
        ("{max_concurrency: 0}", "rollout.tools.python.max_concurrency", 0),
    ],
)
def test_sandbox_options(tool, path, value):
    err = _error([f"rollout.tools={{python: {tool}}}", "rollout.agent_loop=tool"], stage="tools")
    assert err.path == path and (value is None or err.value == value)
    if path.endswith("alow_network"):
        assert err.suggestion == "allow_network"


def test_greedy_group_training_exits_2_with_one_line_before_any_worker(tmp_path, capsys):
    """The issue's command: GRPO (n=2) at temperature 0 is refused at config time."""
    import ray

    from rl_algos.cli import main

    status = main(["train", TINY, "rollout.temperature=0", "trainer.total_steps=1",
                   f"trainer.output_dir={tmp_path}"])  # fmt: skip
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1, lines
    assert lines[0].startswith("rl train: config error: rollout.temperature: invalid value 0.0; ")
    assert not ray.is_initialized()  # no worker, no Ray
    assert not (tmp_path / "checkpoints").exists()


def test_lora_on_an_engine_without_adapters_is_refused_before_any_worker():
    err = _error(["model.lora={rank: 4}", "actor.engine=megatron"], stage="workers")
    assert err.path == "model.lora" and err.value["rank"] == 4
    assert "actor.engine='megatron'" in err.expected
    cfg = load_config(TINY, ["model.lora={rank: 4}"])  # the fsdp engine trains adapters
    assert actor_worker_config(cfg, "/models/m", 0).engine_config.model.lora.rank == 4


def test_a_teacher_prompt_without_a_teacher_is_refused():
    err = _error(["distill.teacher_prompt_key=teacher_prompt"])
    assert err.path == "distill.teacher_prompt_key" and err.value == "teacher_prompt"
    assert "distill.teacher_path" in str(err)
    cfg = load_config(TINY, ["distill.teacher_path=tiny-random:qwen2",
                             "distill.teacher_prompt_key=teacher_prompt"])  # fmt: skip
    assert cfg.distill.teacher_prompt_key == "teacher_prompt"


def test_guided_samples_are_refused_where_they_cannot_work():
    for overrides, path, value, words in (
        (["rollout.guide_prompt_key=g"], "rollout.guided_n", 0, "in 1..rollout.n (2)"),
        (["rollout.guide_prompt_key=g", "rollout.guided_n=3"], "rollout.guided_n", 3,
         "in 1..rollout.n (2)"),
        (["rollout.guided_n=2"], "rollout.guided_n", 2, "without rollout.guide_prompt_key"),
        (["rollout.guide_prompt_key=g", "rollout.guided_n=2", "async.max_staleness=1"],
         "rollout.guide_prompt_key", "g", "belong to the guide's prompt"),
        (["rollout.guide_prompt_key=g", "rollout.guided_n=2", "actor.router_replay=true"],
         "rollout.guide_prompt_key", "g", "actor.router_replay"),
        (["rollout.guided_temperature=0.3"], "rollout.guided_temperature", 0.3,
         "null without guide_prompt_key"),
        (["rollout.guide_prompt_key=g", "rollout.guided_n=2", "rollout.guided_temperature=-0.1"],
         "rollout.guided_temperature", -0.1, "a finite number >= 0 (0: greedy)"),
        (["rollout.guide_prompt_key=g", "rollout.guided_n=2", "rollout.guided_temperature=.inf"],
         "rollout.guided_temperature", float("inf"), "expected a number or null"),
        (["rollout.guide_prompt_key=g", "rollout.guided_n=2", "rollout.guided_temperature=0.3",
          "rollout.generator=my_service"], "rollout.guided_temperature", 0.3,
         "other than 'agent_loop'"),
    ):  # fmt: skip
        err = _error(overrides)
        assert (err.path, err.value) == (path, value) and words in str(err), str(err)
    cfg = load_config(TINY, ["rollout.guide_prompt_key=g", "rollout.guided_n=2"])
    assert (cfg.rollout.guide_prompt_key, cfg.rollout.guided_n) == ("g", 2)
    assert cfg.rollout.guided_temperature is None
    cfg = load_config(TINY, ["rollout.guide_prompt_key=g", "rollout.guided_n=2",
                             "rollout.guided_temperature=0"])  # fmt: skip
    assert cfg.rollout.guided_temperature == 0.0


def test_reference_samples_are_refused_where_they_cannot_work():
    ref = ["rollout.reference_key=answer", "rollout.n=4"]
    for overrides, path, value, words in (
        (ref, "rollout.reference_n", 0, "in 1..rollout.n - 1 - guided_n (3)"),
        ([*ref, "rollout.reference_n=4"], "rollout.reference_n", 4, "one of the model's own"),
        ([*ref, "rollout.reference_n=2", "rollout.guide_prompt_key=g", "rollout.guided_n=2"],
         "rollout.reference_n", 2, "in 1..rollout.n - 1 - guided_n (1)"),
        (["rollout.reference_n=1"], "rollout.reference_n", 1, "0 without rollout.reference_key"),
        ([*ref, "rollout.reference_n=1", "async.max_staleness=1"], "rollout.reference_key",
         "answer", "a reference sample has no rollout log-probs"),
        ([*ref, "rollout.reference_n=1", "actor.router_replay=true"], "rollout.reference_key",
         "answer", "actor.router_replay"),
        ([*ref, "rollout.reference_n=1", "actor.loss.rollout_correction.rollout_is=token"],
         "rollout.reference_key", "answer", "actor.loss.rollout_correction"),
    ):  # fmt: skip
        err = _error(overrides)
        assert (err.path, err.value) == (path, value) and words in str(err), str(err)
    cfg = load_config(TINY, [*ref, "rollout.reference_n=1", "rollout.guide_prompt_key=g",
                             "rollout.guided_n=2"])  # fmt: skip
    assert (cfg.rollout.reference_key, cfg.rollout.reference_n) == ("answer", 1)
    # the curriculum's guided_gap compares the references with the model's own samples
    cfg = load_config(TINY, [*ref, "rollout.reference_n=1", "data.curriculum.enabled=true",
                             "data.curriculum.score=guided_gap"])  # fmt: skip
    assert cfg.data.curriculum.score == "guided_gap"

"""Config loading: defaults, presets, YAML + overrides precedence, and error messages."""

from __future__ import annotations

import re

import pytest

from rl_algos.config import PRESETS, ConfigError, check_plugins, load_config
from rl_algos.config.loader import AGENT_LOOPS
from rl_algos.rollout_correction import RolloutCorrectionConfig
from rl_core.engine import ENGINES
from rl_core.engine.config import OptimizerConfig
from rl_core.rollout import ROLLOUTS, SEQUENCE_GENERATORS

BASE = {
    "model": {"path": "/models/tiny"},
    "data": {"train_files": ["train.parquet"]},
}


def load(overrides=(), base=BASE):
    return load_config(base, list(overrides))


def test_defaults_are_typed_and_derived_fields_filled():
    cfg = load()
    assert cfg.model.path == "/models/tiny" and cfg.model.dtype == "float32"
    assert isinstance(cfg.actor.optim, OptimizerConfig) and cfg.actor.optim.betas == (0.9, 0.999)
    assert cfg.critic.optim.lr == 1e-5
    assert cfg.actor.loss.agg_norm_constant == cfg.data.max_response_length == 256
    assert cfg.trainer.output_dir == "outputs/run"  # interpolated from trainer.run_name
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.rollout.n == 4
    assert not cfg.uses_critic and not cfg.uses_reference
    assert cfg.to_dict()["actor"]["loss"]["clip_ratio_high"] == 0.2


def test_yaml_file_overrides_and_precedence(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "model: {path: /models/tiny}\n"
        "data: {train_files: [a.parquet, b.jsonl], max_response_length: 64}\n"
        "algorithm: {preset: dapo}\n"
        "actor:\n  loss: {clip_ratio_high: 0.3}\n  optim: {lr: 2.0e-6}\n"
        "trainer: {run_name: exp1}\n"
    )
    cfg = load_config(path, ["actor.optim.lr=1e-5", "rollout.n=8", "trainer.loggers=[console]"])
    assert cfg.data.train_files == ["a.parquet", "b.jsonl"]
    assert cfg.actor.loss.clip_ratio_high == 0.3  # YAML beats the preset's 0.28
    assert cfg.actor.loss.clip_ratio_low == 0.2  # from the preset
    assert cfg.actor.optim.lr == 1e-5  # the override beats the YAML
    assert cfg.rollout.n == 8 and cfg.trainer.loggers == ["console"]
    assert cfg.trainer.output_dir == "outputs/exp1"
    assert cfg.algorithm.dynamic_sampling.enabled and cfg.algorithm.overlong.enabled
    assert cfg.algorithm.overlong.buffer_length == 16  # a quarter of max_response_length
    # a preset chosen on the command line replaces the YAML's
    gspo = load_config(path, ["algorithm.preset=gspo"])
    assert gspo.actor.loss.name == "gspo" and gspo.actor.loss.clip_ratio_high == 0.3
    assert not gspo.algorithm.dynamic_sampling.enabled


def test_empty_mapping_override_replaces_instead_of_merging(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "model: {path: /models/tiny}\ndata: {train_files: [a.parquet]}\n"
        "actor:\n  engine: megatron\n  engine_kwargs: {moe_token_dispatcher: allgather}\n"
    )
    assert load_config(path).actor.engine_kwargs == {"moe_token_dispatcher": "allgather"}
    # a non-empty mapping still merges key by key; `{}` empties it
    merged = load_config(path, ["actor.engine_kwargs={vpp: 2}"]).actor.engine_kwargs
    assert merged == {"moe_token_dispatcher": "allgather", "vpp": 2}
    cfg = load_config(path, ["actor.engine=fsdp", "actor.engine_kwargs={}"])
    assert cfg.actor.engine == "fsdp" and cfg.actor.engine_kwargs == {}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_loads_and_sets_only_its_fields(name):
    cfg = load([f"algorithm.preset={name}"])
    preset = PRESETS[name]
    data = cfg.to_dict()

    def walk(expected, actual, path):
        for key, value in expected.items():
            if isinstance(value, dict):
                walk(value, actual[key], f"{path}.{key}")
            else:
                assert actual[key] == value, f"{path}.{key}"

    walk(preset, data, name)
    assert set(preset) <= {"algorithm", "rollout", "actor"}


def test_preset_semantics():
    ppo = load(["algorithm.preset=ppo"])
    assert ppo.uses_critic and ppo.rollout.n == 1
    grpo = load(["algorithm.preset=grpo"])
    assert grpo.uses_reference and grpo.actor.loss.kl_loss_type == "k3"
    dr = load(["algorithm.preset=dr_grpo"])
    assert (
        dr.actor.loss.agg_mode == "seq-mean-token-sum-norm"
        and dr.actor.loss.agg_norm_constant == 256
    )
    rpp = load(["algorithm.preset=reinforce_pp"])
    assert rpp.uses_reference and rpp.algorithm.use_kl_in_reward


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["actor.optim.lrr=1e-6"], "actor.optim.lrr: unknown key 'lrr'; did you mean 'lr'?"),
        (["actorr.engine=fsdp"], "actorr: unknown key 'actorr'; did you mean 'actor'?"),
        (["actor.optim.lr=abc"], "actor.optim.lr: invalid value 'abc'; expected a finite number"),
        (
            ["actor.optim.lr=-1"],
            "actor.optim.lr: invalid value -1.0; expected a finite number >= 0",
        ),
        (
            ["actor.optim.lr_schedule=cosin"],
            "actor.optim.lr_schedule: invalid value 'cosin'; expected one of ['constant', 'cosine']; "
            "did you mean 'cosine'?",
        ),
        (["actor.loss.agg_mode=token_mean"], "did you mean 'token-mean'?"),
        (
            ["actor.loss.clip_ratio_c=0.5"],
            "actor.loss.clip_ratio_c: invalid value 0.5; expected > 1",
        ),
        (["actor.loss.name=gpso"], "actor.loss.name: invalid value 'gpso'; expected one of"),
        (["algorithm.adv_estimator=gea"], "did you mean 'gae'?"),
        (["algorithm.preset=dapoo"], "algorithm.preset: invalid value 'dapoo'; expected one of"),
        (["algorithm.kl_penalty=k4"], "algorithm.kl_penalty: invalid value 'k4'"),
        (["actor.parallel.fsdp_size=0"], "actor.parallel.fsdp_size: invalid value 0"),
        (["actor.optim.betas=[1.5,0.9]"], "actor.optim.betas: invalid value (1.5, 0.9)"),
        (
            ["trainer.num_workers=two"],
            "trainer.num_workers: invalid value 'two'; expected an integer",
        ),
        (["trainer.loggers=[console,wandbb]"], "trainer.loggers[1]: invalid value 'wandbb'"),
        (
            ["trainer.backend=local", "trainer.num_workers=2"],
            "trainer.num_workers: invalid value 2",
        ),
        (["rollout.top_p=0"], "rollout.top_p: invalid value 0.0; expected in (0, 1]"),
        (["rollout.n=1"], "rollout.n: invalid value 1; expected >= 2: algorithm.adv_estimator="),
        (["rollout.temperature=0"], "rollout.temperature: invalid value 0.0; expected > 0 with"),
        (["trainer.placement=split"], "trainer.placement: renamed to 'critic.placement'"),
        (["trainer.critic_workers=2"], "trainer.critic_workers: renamed to 'critic.num_workers'"),
        (["critic.placement=apart"], "critic.placement: invalid value 'apart'; expected one of"),
        (["async.max_stalenes=1"], "async.max_stalenes: unknown key 'max_stalenes'; did you mean"),
        (["trainer.output_dir=${trainer.nam}"], "trainer.output_dir: unresolvable interpolation"),
        (["rollout.n=0"], "rollout.n: invalid value 0; expected an integer >= 1"),
        (["actor.mini_batch_size=3"], "expected a divisor of data.train_batch_size=8"),
        (["model.dtype=fp32"], "model.dtype: invalid value 'fp32'; expected one of"),
        (["model.dtype=null"], "model.dtype: invalid value None"),
        (["actor=5"], "actor: invalid value 5; expected a mapping of ActorConfig fields"),
        (["data.train_files=[]"], "data.train_files: missing; expected a list of"),
        (["model.path=null"], "model.path: missing"),
        (
            ["algorithm.overlong.enabled=true", "algorithm.overlong.buffer_length=1000"],
            "algorithm.overlong.buffer_length: invalid value 1000",
        ),
        (
            ["algorithm.adv_estimator=gae", "algorithm.dynamic_sampling.enabled=true"],
            "algorithm.dynamic_sampling.enabled",
        ),
        (["lr"], "overrides: invalid value 'lr'; expected key=value"),
    ],
)
def test_errors_name_the_key_value_and_what_is_allowed(overrides, message):
    with pytest.raises(ConfigError) as info:
        load(overrides)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(f"{info.value.path}: ")  # the path is structured


def test_greedy_training_rollouts_keep_the_temperature_zero_rule():
    from rl_core.rollout import logprob_temperature

    cfg = load(["algorithm.adv_estimator=reinforce_plus_plus", "rollout.n=1",
                "rollout.temperature=0"])  # fmt: skip
    assert cfg.rollout.temperature == 0.0
    # greedy tokens' log-probs are log_softmax(logits): the trainer recomputes at 1
    assert logprob_temperature(cfg.rollout.temperature) == 1.0
    assert logprob_temperature(0.7) == 0.7


def test_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping of sections"):
        load_config(bad)


def test_to_yaml_round_trips(tmp_path):
    cfg = load(
        [
            "algorithm.preset=dapo",
            "actor.optim.betas=[0.8,0.95]",
            "rollout.tools={calc: {timeout: 3}}",
        ]
    )
    path = tmp_path / "resolved.yaml"
    path.write_text(cfg.to_yaml())
    again = load_config(path)
    assert again == cfg
    assert again.rollout.tools == {"calc": {"timeout": 3}}


def test_plugin_names_are_checked_at_trainer_start():
    cfg = load(["actor.engine=fsdpp"])
    registries = [(ENGINES, "fsdp"), (ROLLOUTS, "hf"), (SEQUENCE_GENERATORS, "agent_loop")]
    registries.append((AGENT_LOOPS, "single_turn"))
    for registry, name in registries:
        registry.register(name, object(), overwrite=True)
    try:
        with pytest.raises(ConfigError) as info:
            check_plugins(cfg)
        text = str(info.value)
        assert text.startswith("actor.engine: invalid value 'fsdpp'")
        assert "did you mean 'fsdp'?" in text and "pip install 'rl-engines[fsdp]'" in text
        cfg.actor.engine = "fsdp"
        check_plugins(cfg)  # every name resolves
        cfg.rollout.backend = "vlm"
        with pytest.raises(ConfigError, match=r"rollout\.backend: invalid value 'vlm'"):
            check_plugins(cfg)
        cfg.rollout.backend = "hf"
        cfg.rollout.agent_loop = "no_such_loop"
        with pytest.raises(ConfigError, match=r"rollout\.agent_loop: invalid value 'no_such_loop'"):
            check_plugins(cfg)
        cfg.rollout.agent_loop = "single_turn"
        cfg.algorithm.adv_estimator = "gae"
        cfg.critic.engine = "no_such_engine"  # (megatron is installed in the workspace env)
        with pytest.raises(ConfigError, match=r"critic\.engine: invalid value 'no_such_engine'"):
            check_plugins(cfg)
    finally:
        for registry, name in registries:
            registry.unregister(name)


def test_async_section_uses_its_yaml_name_and_resolves_the_correction(tmp_path):
    cfg = load(["async.max_staleness=2"])
    corr = cfg.actor.loss.rollout_correction  # null + stale samples: decoupled PPO, cap 2
    assert cfg.async_.max_staleness == 2 and corr == RolloutCorrectionConfig.decoupled_ppo(2.0)
    assert (corr.rollout_is, corr.rollout_is_threshold, corr.is_bounds) == (
        "token",
        "0_2.0",
        (0.0, 2.0),
    )
    assert load().actor.loss.rollout_correction is None
    off = load(["async.max_staleness=1", "actor.loss.rollout_correction={}"])
    assert not off.actor.loss.rollout_correction.enabled  # an explicit {} turns it off
    tis = load(["async.max_staleness=1", "actor.loss.rollout_correction.rollout_is=token",
                "actor.loss.rollout_correction.rollout_is_threshold=3"])  # fmt: skip
    assert tis.actor.loss.rollout_correction == RolloutCorrectionConfig.tis(3.0)
    path = tmp_path / "async.yaml"
    path.write_text(cfg.to_yaml())
    assert "async:" in path.read_text() and "async_" not in path.read_text()
    assert load_config(path) == cfg
    with pytest.raises(ConfigError, match=r"async\.max_staleness.*>= 0"):
        load(["async.max_staleness=-1"])
    # the settings that moved into actor.loss.rollout_correction say where
    with pytest.raises(ConfigError, match=r"async\.correction.*actor\.loss\.rollout_correction"):
        load(["async.correction=tis"])
    with pytest.raises(ConfigError, match=r"actor\.loss\.tis_cap.*rollout_is: token"):
        load(["actor.loss.tis_cap=2"])


def test_rollout_placement_fields_are_checked():
    assert load(["rollout.placement=split", "rollout.num_replicas=3"]).rollout.num_replicas == 3
    with pytest.raises(ConfigError, match=r"rollout\.placement.*'split'"):
        load(["rollout.placement=splitt"])
    with pytest.raises(ConfigError, match=r"rollout\.remote_urls.*non-empty list"):
        load(["rollout.placement=remote"])
    with pytest.raises(ConfigError, match=r"rollout\.num_replicas"):
        load(["rollout.num_replicas=0"])


@pytest.mark.parametrize(
    "override",
    [
        "algorithm.adv_estimator=opo",
        "algorithm.adv_estimator=gpg",
        "algorithm.adv_estimator=grpo_passk",
        *(
            f"actor.loss.name={name}"
            for name in ("clip_cov", "kl_cov", "gpg", "geo_mean", "cispo", "sapo")
        ),
        *(f"actor.loss.name={name}" for name in ("dppo_tv", "dppo_kl", "dro", "reinforce")),
        *(f"actor.loss.kl_loss_type={kind}" for kind in ("k1+", "k3+", "low_var_kl+")),
        "algorithm.kl_penalty=k3+",
        "actor.loss.agg_mode=token-sum",
    ],
)
def test_new_algorithm_names_are_selectable(override):
    cfg = load([override])
    key, value = override.split("=")
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    assert node == value


def test_new_loss_settings_live_under_verl_names_and_fail_with_the_key():
    cfg = load(
        [
            "actor.loss.name=clip_cov",
            "actor.loss.clip_cov_ratio=0.01",
            "actor.loss.clip_cov_lb=0.5",
            "actor.loss.clip_cov_ub=2",
            "actor.loss.kl_cov_ratio=0.02",
            "actor.loss.ppo_kl_coef=0.5",
            "actor.loss.dro_beta=0.3",
            "actor.loss.tau_pos=2",
            "actor.loss.tau_neg=3",
        ]
    )
    loss = cfg.actor.loss
    assert (loss.clip_cov_ratio, loss.clip_cov_lb, loss.clip_cov_ub) == (0.01, 0.5, 2.0)
    assert (loss.kl_cov_ratio, loss.ppo_kl_coef, loss.dro_beta) == (0.02, 0.5, 0.3)
    assert (loss.tau_pos, loss.tau_neg) == (2.0, 3.0)
    with pytest.raises(
        ConfigError, match=r"^actor\.loss\.dro_beta: invalid value -1\.0; expected > 0$"
    ):
        load(["actor.loss.dro_beta=-1"])
    with pytest.raises(
        ConfigError, match=r"actor\.loss\.name: invalid value 'clip-cov'.*'clip_cov'"
    ):
        load(["actor.loss.name=clip-cov"])


@pytest.mark.parametrize("estimator", ["opo", "gpg", "grpo_passk"])
def test_group_estimators_need_several_samples(estimator):
    with pytest.raises(ConfigError, match=r"rollout\.n: invalid value 1"):
        load([f"algorithm.adv_estimator={estimator}", "rollout.n=1"])


def test_cpus_per_worker_default_splits_a_cpu_node_among_its_workers():
    from rl_algos.trainer.placement import default_cpus_per_worker

    assert load().trainer.cpus_per_worker is None
    assert default_cpus_per_worker("cpu", 2.0, 1, 1) == 2.0  # 1 process x 2 threads
    assert default_cpus_per_worker("cpu", 2.0, 1, 2) == 1.0  # 2 ranks x 1 thread
    assert default_cpus_per_worker("cpu", 16.0, 2, 3) == 2.0  # 8 per node // 3, whole CPUs
    assert default_cpus_per_worker("cpu", 2.0, 1, 4) == 1.0  # never below 1
    assert default_cpus_per_worker("cuda", 64.0, 1, 8) == 1.0
    with pytest.raises(ConfigError, match="cpus_per_worker"):
        load(["trainer.cpus_per_worker=0"])


@pytest.mark.parametrize(
    ("overrides", "path", "expected"),
    [
        (["algorithm.preset=ppo"], "rollout_correction.rollout_rs",
         "GAE skips masked tokens"),
        (["actor.recompute_old_log_probs=false"], "actor.recompute_old_log_probs",
         "rejection needs the old log-probs"),
    ],
)  # fmt: skip
def test_a_rejection_that_cannot_be_used_is_refused_with_one_line(overrides, path, expected):
    rs = ["actor.loss.rollout_correction.rollout_rs=token_k2",
          "actor.loss.rollout_correction.rollout_rs_threshold=0.1"]  # fmt: skip
    with pytest.raises(ConfigError, match=rf"{re.escape(path)}.*{expected}") as info:
        load([*rs, *overrides])
    assert "\n" not in str(info.value)
    assert load(rs).actor.loss.rollout_correction.rejects  # alone it is accepted


def test_failover_without_a_snapshot_or_checkpoint_is_refused_in_one_line():
    """``max_restarts > 0`` with snapshots off and no ``save_every`` would send a run back to
    step 0 at its first lost worker: refused, naming the three fields."""
    off = ["trainer.snapshot_every=0", "trainer.save_every=0"]
    with pytest.raises(ConfigError) as info:
        load([*off, "trainer.max_restarts=2"])
    message = str(info.value)
    assert info.value.path == "trainer.max_restarts" and "\n" not in message
    for field in ("trainer.snapshot_every=0", "trainer.save_every=0", "trainer.max_restarts=0"):
        assert field in message
    assert load().trainer.snapshot_every == 1  # the defaults: snapshots on
    for fine in (["trainer.max_restarts=0"], ["trainer.save_every=5"],
                 ["trainer.snapshot_every=3"], ["trainer.backend=local"]):  # fmt: skip
        load([*off, "trainer.max_restarts=2", *fine])
    with pytest.raises(ConfigError, match=r"trainer\.snapshot_every: invalid value -1"):
        load(["trainer.snapshot_every=-1"])


def test_colocated_rollout_with_tensor_parallelism_is_refused_in_one_line():
    """Each colocated training process hosts a one-device rollout engine: TP > 1 there would
    fail inside every worker, so it is refused at config time, naming the field."""
    with pytest.raises(ConfigError) as info:
        load(["rollout.tensor_parallel_size=2"])
    message = str(info.value)
    assert "rollout.tensor_parallel_size" in message and "colocated" in message, message
    assert len(message.splitlines()) == 1, message
    split = load(["rollout.tensor_parallel_size=2", "rollout.placement=split",
                  "rollout.gpus_per_replica=2"])  # fmt: skip
    assert split.rollout.tensor_parallel_size == 2

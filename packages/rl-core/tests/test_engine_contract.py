"""TrainEngine contract: configs, LR schedule, batch checks, micro-batch splits, registry."""

from __future__ import annotations

import math
from importlib.metadata import EntryPoint

import pytest
import torch

from rl_core.engine import (
    ENGINES,
    EngineConfig,
    MicroBatchConfig,
    OptimizerConfig,
    ParallelConfig,
    TrainEngine,
    build_engine,
    check_batch,
    check_outputs,
    local_micro_batch_count,
    split_micro_batches,
)
from rl_core.protocol import DataProto
from rl_core.registry import PluginLoadError, UnknownPluginError


def rl_batch(lengths: list[tuple[int, int]], prompt_len: int = 5, resp_len: int = 4) -> DataProto:
    """Rows with (real prompt tokens, real response tokens) in the verl layout."""
    n, seq = len(lengths), prompt_len + resp_len
    attention = torch.zeros(n, seq, dtype=torch.long)
    response_mask = torch.zeros(n, resp_len, dtype=torch.long)
    for i, (p, r) in enumerate(lengths):
        attention[i, prompt_len - p : prompt_len + r] = 1
        response_mask[i, :r] = 1
    ids = torch.arange(1, n * seq + 1).view(n, seq) * attention
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": attention,
            "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, prompt_len:].clone(),
            "response_mask": response_mask,
        }
    )


# ---- configs ---------------------------------------------------------------------------


def test_engine_config_from_nested_dict():
    cfg = EngineConfig.from_dict(
        {
            "model": {"path": "/m", "value_head": True},
            "optim": {"lr": 1e-5, "betas": [0.9, 0.95]},
            "micro_batch": {"max_tokens_per_micro_batch": 4096},
            "on_nan": "skip",
        }
    ).validate()
    assert cfg.model.value_head and cfg.optim.betas == (0.9, 0.95)
    assert cfg.infer_micro_batch_config.max_tokens_per_micro_batch == 4096
    assert EngineConfig.from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (
            {"model": {"path": "/m", "dtyp": "float32"}},
            r"^EngineConfig.model.dtyp: unknown key 'dtyp'; did you mean 'dtype'\? \(EngineConfig.model has: ",
        ),
        ({"model": {}}, r"^EngineConfig.model.path: missing; expected exactly one of path"),
        ({"model": {"path": "/m", "config": {"model_type": "llama"}}}, "exactly one"),
        ({"model": {"config": {"hidden_size": 8}}}, "model_type"),
        (
            {"model": {"path": "/m", "dtype": "fp8"}},
            r"^EngineConfig.model.dtype: invalid value 'fp8'; expected one of",
        ),
        (
            {"model": {"path": "/m"}, "optim": {"lr": -1.0}},
            r"^EngineConfig.optim.lr: invalid value -1.0; expected a finite number >= 0$",
        ),
        ({"model": {"path": "/m"}, "optim": {"betas": (0.9, 1.0)}}, "betas"),
        ({"model": {"path": "/m"}, "optim": {"lr_schedule": "cosine"}}, "total_steps"),
        ({"model": {"path": "/m"}, "optim": {"lr_schedule": "linear"}}, "lr_schedule"),
        (
            {"model": {"path": "/m"}, "parallel": {"fsdp_size": 0}},
            r"^EngineConfig.parallel.fsdp_size: invalid value 0",
        ),
        (
            {"model": {"path": "/m"}, "parallel": {"reshard_after_forward": 1}},
            r"^EngineConfig.parallel.reshard_after_forward: invalid value 1; expected true or false or null$",
        ),
        (
            {
                "model": {"path": "/m"},
                "micro_batch": {"micro_batch_size": 2, "max_tokens_per_micro_batch": 9},
            },
            "at most one of them",
        ),
        (
            {"model": {"path": "/m"}, "micro_batch": {"micro_batch_size": 0}},
            r"^EngineConfig.micro_batch.micro_batch_size: invalid value 0",
        ),
        (
            {"model": {"path": "/m"}, "on_nan": "ignore"},
            r"^EngineConfig.on_nan: invalid value 'ignore'",
        ),
        ({"model": {"path": "/m"}, "timeout_s": 0}, "timeout_s"),
    ],
)
def test_engine_config_rejects_bad_fields(data, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig.from_dict(data).validate()


@pytest.mark.parametrize(
    ("world", "fsdp", "rep", "expected"),
    [
        (4, -1, -1, (1, 4)),
        (4, 2, -1, (2, 2)),
        (4, -1, 2, (2, 2)),
        (8, 4, 2, (2, 4)),
        (1, -1, -1, (1, 1)),
    ],
)
def test_dp_layout(world, fsdp, rep, expected):
    assert ParallelConfig(fsdp_size=fsdp, replicate_size=rep).dp_layout(world) == expected


@pytest.mark.parametrize(("world", "fsdp", "rep"), [(4, 3, -1), (4, 2, 3), (6, -1, 4)])
def test_dp_layout_that_does_not_fit(world, fsdp, rep):
    with pytest.raises(
        ValueError, match=r"^parallel.fsdp_size: invalid value .*data-parallel ranks$"
    ):
        ParallelConfig(fsdp_size=fsdp, replicate_size=rep).dp_layout(world)


def test_lr_schedule_warmup_constant_and_cosine():
    const = OptimizerConfig(lr=1.0, warmup_steps=4).validate()
    assert [const.lr_factor(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cos = OptimizerConfig(
        lr_schedule="cosine", warmup_ratio=0.2, total_steps=10, min_lr_ratio=0.1
    ).validate()
    assert cos.num_warmup_steps == 2
    assert cos.lr_factor(0) == 0.5 and cos.lr_factor(1) == 1.0
    assert cos.lr_factor(2) == pytest.approx(1.0)
    # half-way through the decay: the mean of 1 and the floor
    assert cos.lr_factor(6) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert cos.lr_factor(10) == pytest.approx(0.1) and cos.lr_factor(50) == pytest.approx(0.1)


# ---- batches and micro-batches ---------------------------------------------------------


def test_check_batch_accepts_the_layout():
    assert check_batch(rl_batch([(2, 3), (5, 4)])) == (2, 9, 4)


def test_check_batch_errors_name_the_field():
    good = rl_batch([(2, 3), (5, 4)])
    t = dict(good.batch.items())
    with pytest.raises(ValueError, match=r"missing field\(s\) \['response_mask'\]"):
        check_batch(
            good.select(batch_keys=["input_ids", "attention_mask", "position_ids", "responses"])
        )
    with pytest.raises(ValueError, match=r"batch\['attention_mask'\] has shape \(2, 8\)"):
        check_batch(DataProto.from_dict({**t, "attention_mask": t["attention_mask"][:, :8]}))
    with pytest.raises(ValueError, match=r"batch\['response_mask'\] has shape \(2, 3\)"):
        check_batch(DataProto.from_dict({**t, "response_mask": t["response_mask"][:, :3]}))
    with pytest.raises(ValueError, match="input_ids = cat"):
        check_batch(DataProto.from_dict({**t, "responses": t["responses"] + 1}))
    with pytest.raises(ValueError, match="integer token ids"):
        check_batch(DataProto.from_dict({**t, "input_ids": t["input_ids"].float()}))


def test_check_outputs():
    assert check_outputs("log_probs", value_model=False) == ("log_probs",)
    assert check_outputs(["values"], value_model=True) == ("values",)
    with pytest.raises(ValueError, match="invalid for a value model"):
        check_outputs(("log_probs",), value_model=True)
    with pytest.raises(ValueError, match="invalid for a causal LM"):
        check_outputs(("values",), value_model=False)


def test_split_by_count_covers_every_row_once():
    batch = rl_batch([(1, 1)] * 7)
    cfg = MicroBatchConfig(micro_batch_size=3)
    assert local_micro_batch_count(batch, cfg) == 3
    parts = split_micro_batches(batch, cfg, 3)
    assert [idx for _, idx in parts] == [[0, 1, 2], [3, 4], [5, 6]]
    assert torch.equal(parts[1][0].batch["input_ids"], batch.batch["input_ids"][3:5])
    # another DP rank needs more micro-batches: this one splits further
    assert [len(idx) for _, idx in split_micro_batches(batch, cfg, 4)] == [2, 2, 2, 1]


def test_split_by_token_budget_respects_budget():
    lengths = [(5, 4), (1, 1), (3, 2), (2, 2), (5, 1), (1, 3)]  # real lengths 9 2 5 4 6 4
    batch = rl_batch(lengths)
    cfg = MicroBatchConfig(max_tokens_per_micro_batch=10)
    count = local_micro_batch_count(batch, cfg)
    assert count == 4  # first-fit decreasing: [9] [6 4] [5 4] [2]
    for want in (count, count + 2):
        parts = split_micro_batches(batch, cfg, want)
        assert len(parts) == want
        assert sorted(i for _, idx in parts for i in idx) == list(range(len(lengths)))
        for mb, _ in parts:
            assert int(mb.batch["attention_mask"].sum()) <= 10
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch=8 is smaller than sequence 0"):
        local_micro_batch_count(batch, MicroBatchConfig(max_tokens_per_micro_batch=8))
    with pytest.raises(ValueError, match="7 non-empty micro-batches"):
        split_micro_batches(batch, cfg, 7)


def test_whole_batch_without_micro_batching():
    batch = rl_batch([(1, 1)] * 3)
    assert local_micro_batch_count(batch, MicroBatchConfig()) == 1


# ---- registry -------------------------------------------------------------------------


class _EchoEngine(TrainEngine):
    """A stand-in that only records its config (the registry test needs no model)."""

    def __init__(self, config):
        self.config = config

    dp_rank = dp_size = is_collect_rank = global_step = property(lambda self: 0)
    device = property(lambda self: torch.device("cpu"))
    train_batch = infer_batch = export_weights = save = load = offload = onload = None


def test_build_engine_by_name_validates_the_config():
    ENGINES.register("echo-test", _EchoEngine)
    try:
        engine = build_engine("echo-test", {"model": {"path": "/m"}})
        assert isinstance(engine, _EchoEngine) and engine.config.model.path == "/m"
        with pytest.raises(ValueError, match="exactly one"):
            build_engine("echo-test", {"model": {}})
    finally:
        ENGINES.unregister("echo-test")


def test_build_engine_rejects_non_engines():
    ENGINES.register("not-an-engine", lambda config: object())
    try:
        with pytest.raises(TypeError, match=r"not a rl_core\.engine\.TrainEngine"):
            build_engine("not-an-engine", {"model": {"path": "/m"}})
    finally:
        ENGINES.unregister("not-an-engine")


def test_unknown_engine_lists_installed_ones():
    ENGINES.register("echo-test", _EchoEngine)
    try:
        with pytest.raises(UnknownPluginError, match=r"unknown training engine 'fsdpp'.*echo-test"):
            build_engine("fsdpp", {"model": {"path": "/m"}})
    finally:
        ENGINES.unregister("echo-test")


def test_engine_with_missing_extra_names_it(monkeypatch):
    broken = EntryPoint(name="broken", value="rl_no_such_module_xyz:Engine", group="rl.engines")
    monkeypatch.setattr(ENGINES, "_entry_points", lambda: {"broken": broken})
    with pytest.raises(PluginLoadError, match=r"could not be imported.*\[broken\]"):
        build_engine("broken", {"model": {"path": "/m"}})

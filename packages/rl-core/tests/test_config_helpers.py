"""rl_core.config: the one typed config mechanism (build, validate, ConfigError)."""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from rl_core.config import NOTHING, ConfigError, build, check, is_int, is_real, validate
from rl_core.engine import EngineConfig, LoRAConfig, MicroBatchConfig, ModelConfig, OptimizerConfig


@dataclass
class _Inner:
    size: int = 1
    ratio: float = 0.5
    mode: Literal["a", "b"] = "a"
    pair: tuple[float, float] = (0.0, 1.0)
    RENAMED = {"width": "size"}

    def check(self) -> None:
        check(self.size >= 1, "size", self.size, "an integer >= 1")


@dataclass
class _Outer:
    name: str = "x"
    inner: _Inner = field(default_factory=_Inner)
    maybe: _Inner | None = None
    raw: dict = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    table: dict[str, int] = field(default_factory=dict)
    anything: Any = None


def _error(data: Any, path: str = "cfg") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        build(_Outer, data, path)
    return info.value


def test_nested_dataclasses_are_built_from_mappings():
    built = build(_Outer, {"inner": {"size": 3}, "maybe": {"size": 4}}, "cfg")
    assert built == _Outer(name="x", inner=_Inner(3), maybe=_Inner(4))
    # a plain dict field stays a dict; an instance passes through (validated)
    assert build(_Outer, {"raw": {"size": 5}}, "cfg").raw == {"size": 5}
    same = _Outer()
    assert build(_Outer, same, "cfg") is same


def test_conversions_are_only_the_lossless_ones():
    built = build(_Outer, {"inner": {"ratio": 2, "pair": [1, 0.5]}})
    assert built.inner.ratio == 2.0 and isinstance(built.inner.ratio, float)
    assert built.inner.pair == (1.0, 0.5) and isinstance(built.inner.pair, tuple)
    for bad in ("2", 2.5, True):  # a string, a fraction, a bool are never an int
        assert _error({"inner": {"size": bad}}).path == "cfg.inner.size"


@pytest.mark.parametrize(
    ("data", "path", "value", "expected"),
    [
        ({"inner": {"size": "3"}}, "cfg.inner.size", "3", "an integer"),
        ({"inner": {"ratio": math.nan}}, "cfg.inner.ratio", math.nan, "a finite number"),
        ({"inner": {"mode": "c"}}, "cfg.inner.mode", "c", "one of ['a', 'b']"),
        ({"inner": {"pair": [1]}}, "cfg.inner.pair", [1], "a list of 2 items (a number, a number)"),
        ({"inner": {"size": 0}}, "cfg.inner.size", 0, "an integer >= 1"),  # the class's rule
        ({"maybe": 3}, "cfg.maybe", 3, "a mapping of _Inner fields or null"),
        ({"tags": ["a", 1]}, "cfg.tags[1]", 1, "a string"),
        ({"table": {"k": "v"}}, "cfg.table.k", "v", "an integer"),
        ({"name": None}, "cfg.name", None, "a string"),
    ],
)
def test_type_errors_carry_path_value_and_expectation(data, path, value, expected):
    err = _error(data)
    assert (err.path, err.expected, err.problem) == (path, expected, "invalid value")
    assert err.value == value or (value != value and err.value != err.value)  # NaN
    assert str(err) == f"{path}: invalid value {value!r}; expected {expected}"


def test_unknown_keys_suggest_and_renamed_keys_say_the_new_name():
    err = _error({"inner": {"sise": 3}})
    assert (err.path, err.suggestion, err.value) == ("cfg.inner.sise", "size", NOTHING)
    assert err.problem == "unknown key 'sise'"
    assert "\n" not in str(err)
    assert str(err) == (
        "cfg.inner.sise: unknown key 'sise'; did you mean 'size'? "
        "(cfg.inner has: size, ratio, mode, pair)"
    )
    renamed = _error({"inner": {"width": 3}})
    assert (renamed.path, renamed.problem, renamed.expected) == (
        "cfg.inner.width",
        "renamed",
        "size",
    )
    assert str(renamed) == "cfg.inner.width: renamed to 'size'"
    assert _error([1]).path == "cfg"


def test_errors_survive_pickling_and_prefixing():
    err = ConfigError("lr", "a number >= 0", value=-1.0)
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.path, copy.value, copy.expected, str(copy)) == (
        "lr",
        -1.0,
        "a number >= 0",
        str(err),
    )
    moved = err.under("actor.optim")
    assert moved.path == "actor.optim.lr" and moved.key == "actor.optim.lr"
    assert moved.detail == "invalid value -1.0; expected a number >= 0"
    assert isinstance(err, ValueError)


def test_validate_checks_objects_made_in_python():
    obj = _Outer(inner=_Inner(ratio=1, pair=[0, 1]))  # type: ignore[arg-type]
    assert validate(obj) is obj and obj.inner.pair == (0.0, 1.0)
    with pytest.raises(ConfigError) as info:
        validate(_Outer(inner=_Inner(size=-2)), "top")
    assert info.value.path == "top.inner.size"
    with pytest.raises(ConfigError, match=r"^OptimizerConfig\.lr: invalid value -1"):
        OptimizerConfig(lr=-1).validate()
    with pytest.raises(ConfigError) as info:
        EngineConfig(
            model=ModelConfig(path="/m"), optim=OptimizerConfig(lr_schedule="cosine")
        ).validate()
    assert info.value.path == "EngineConfig.optim.total_steps"


def test_engine_config_builds_every_nested_section():
    cfg = EngineConfig.from_dict(
        {
            "model": {"path": "/m", "lora": {"rank": 4}},
            "infer_micro_batch": {"micro_batch_size": 2},
            "engine_kwargs": {"attn_implementation": "eager"},
        }
    )
    assert cfg.model.lora == LoRAConfig(rank=4)
    assert cfg.infer_micro_batch == MicroBatchConfig(micro_batch_size=2)
    assert cfg.engine_kwargs == {"attn_implementation": "eager"}  # the backend's to read
    with pytest.raises(ConfigError) as info:
        EngineConfig.from_dict({"model": {"path": "/m", "attn_implementation": "sdpa"}})
    assert info.value.path == "EngineConfig.model.attn_implementation"
    with pytest.raises(ConfigError) as info:
        EngineConfig.from_dict({"model": {"path": "/m", "lora": {"rank": 0}}})
    assert info.value.path == "EngineConfig.model.lora.rank"


@pytest.mark.parametrize(
    ("value", "integer", "real"),
    [(3, True, True), (True, False, False), (2.5, False, True), (math.inf, False, False),
     (math.nan, False, False), ("3", False, False), (None, False, False)],
)  # fmt: skip
def test_number_checks(value, integer, real):
    assert is_int(value) is integer
    assert is_real(value) is real

"""rl_core.config: the one dataclass-from-mapping helper and the number checks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from rl_core.config import dataclass_from_dict, is_int, is_real
from rl_core.engine import EngineConfig, LoRAConfig, MicroBatchConfig


@dataclass
class _Inner:
    size: int = 1


@dataclass
class _Outer:
    name: str = "x"
    inner: _Inner = field(default_factory=_Inner)
    maybe: _Inner | None = None
    raw: dict = field(default_factory=dict)


def test_nested_dataclasses_are_built_from_mappings():
    built = dataclass_from_dict(_Outer, {"inner": {"size": 3}, "maybe": {"size": 4}}, "cfg")
    assert built == _Outer(name="x", inner=_Inner(3), maybe=_Inner(4))
    # a plain dict field stays a dict; an instance passes through untouched
    assert dataclass_from_dict(_Outer, {"raw": {"size": 5}}, "cfg").raw == {"size": 5}
    same = _Outer()
    assert dataclass_from_dict(_Outer, same, "cfg") is same


def test_unknown_keys_and_non_mappings_name_the_place():
    with pytest.raises(
        ValueError, match=r"^cfg\.inner: unknown key\(s\) \['sise'\]; expected some of \['size'\]$"
    ):
        dataclass_from_dict(_Outer, {"inner": {"sise": 3}}, "cfg")
    with pytest.raises(
        ValueError, match=r"^cfg=\[1\] is invalid: expected a mapping of _Outer fields$"
    ):
        dataclass_from_dict(_Outer, [1], "cfg")


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
    with pytest.raises(
        ValueError, match=r"EngineConfig\.model: unknown key\(s\) \['attn_implementation'\]"
    ):
        EngineConfig.from_dict({"model": {"path": "/m", "attn_implementation": "sdpa"}})


@pytest.mark.parametrize(
    ("value", "integer", "real"),
    [(3, True, True), (True, False, False), (2.5, False, True), (math.inf, False, False),
     (math.nan, False, False), ("3", False, False), (None, False, False)],
)  # fmt: skip
def test_number_checks(value, integer, real):
    assert is_int(value) is integer
    assert is_real(value) is real

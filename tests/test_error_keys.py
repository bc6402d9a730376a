"""Error messages name real config keys: every dotted key of the trainer's config
(``reward.function_path``, ``data.generate.options`` ...) that an error message, a
warning or a config check in any package's source mentions exists in the schema."""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from pathlib import Path

from rl_algos.config.schema import RLConfig
from rl_core.config import key_of

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = [key_of(f) for f in dataclasses.fields(RLConfig)]
# a section name at a word start (not inside a module path or a file name), then .field...
KEY = re.compile(r"(?<![\w./-])(?:" + "|".join(SECTIONS) + r")(?:\.[A-Za-z_]\w*)+")
# calls whose string arguments are messages a user reads
MESSAGE_CALLS = {"check", "warning", "error", "exception", "print"}
FILE_SUFFIXES = {"py", "json", "jsonl", "yaml", "yml", "parquet", "pt", "txt", "md"}


def _dataclass_in(hint: typing.Any) -> type | None:
    """The dataclass a field holds (also through ``X | None``), else None."""
    args = typing.get_args(hint) if typing.get_origin(hint) is not None else (hint,)
    found = [a for a in args if dataclasses.is_dataclass(a)]
    return found[0] if found else None


def key_exists(key: str) -> bool:
    """Whether `key` is a field path of RLConfig (anything below a free-form mapping
    field such as ``data.generate.options`` or ``rollout.tools`` counts as existing)."""
    cls: type | None = RLConfig
    parts = key.split(".")
    for i, part in enumerate(parts):
        hints = typing.get_type_hints(cls)
        names = {key_of(f): f.name for f in dataclasses.fields(cls)}
        if part not in names:
            return part in getattr(cls, "RENAMED", {}) and i == len(parts) - 1
        sub = _dataclass_in(hints[names[part]])
        if sub is None:
            return typing.get_origin(hints[names[part]]) is dict or i == len(parts) - 1
        cls = sub
    return True


def _message_nodes(tree: ast.AST) -> list[ast.AST]:
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            roots.append(node.exc)
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in MESSAGE_CALLS or name.endswith("Error"):
                roots.append(node)
    return roots


def keys_in_messages(source: str) -> list[tuple[int, str]]:
    """(line, key) for every dotted config key in the error/warning messages of `source`."""
    strings = {
        id(node): node
        for root in _message_nodes(ast.parse(source))
        for node in ast.walk(root)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    found = []
    for node in sorted(strings.values(), key=lambda n: (n.lineno, n.col_offset)):
        keys = (m.group(0) for m in KEY.finditer(node.value))
        found += [(node.lineno, k) for k in keys if k.rsplit(".", 1)[1] not in FILE_SUFFIXES]
    return found


def test_the_walk_finds_keys_and_knows_real_ones_from_made_up_ones():
    # the message that motivated this test: a key that never existed
    old = 'raise FileNotFoundError(f"reward.custom_function.path: no such file {p!r}")\n'
    assert keys_in_messages(old) == [(1, "reward.custom_function.path")]
    assert not key_exists("reward.custom_function.path")
    checked = 'check(ok, "x", 1, "<= data.max_response_length and actor.optim.lr")'
    assert [k for _, k in keys_in_messages(checked)] == [
        "data.max_response_length",
        "actor.optim.lr",
    ]
    assert key_exists("actor.optim.lr") and key_exists("data.generate.options.max_value")
    assert key_exists("rollout.tools") and not key_exists("actor.optim.lrr")
    assert key_exists("async.max_staleness") and key_exists("trainer.placement")  # renamed
    # module paths and file names are not keys
    assert keys_in_messages('raise ValueError("see rl_algos.data.io and reward.py")') == []


def test_every_key_named_in_an_error_message_exists():
    files = sorted(ROOT.glob("packages/*/src/**/*.py")) + sorted(
        ROOT.glob("integrations/*/src/**/*.py")
    )
    assert len(files) > 50
    checked, wrong = 0, []
    for path in files:
        for line, key in keys_in_messages(path.read_text()):
            checked += 1
            if not key_exists(key):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {key}")
    assert not wrong, "error messages name keys the config does not have:\n" + "\n".join(wrong)
    assert checked > 30  # the walk does find the keys the messages name

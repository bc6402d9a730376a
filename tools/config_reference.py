"""Write docs/config-reference.md: every key of the trainer's config (`rl train`), with
its type, default and documentation, generated from the typed config classes.

    python tools/config_reference.py          # rewrite the file
    python tools/config_reference.py --check  # exit 1 if it is out of date (CI)

A field's doc is its attribute docstring (the string right after it in the class body);
fields without one point at their section's docstring, which is printed above the table.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import re
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

from rl_algos.config.schema import RLConfig
from rl_core.config import describe, key_of

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "config-reference.md"


def _attribute_docs(cls: type) -> dict[str, str]:
    """Field name -> the string literal that follows its annotation in the class body."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body  # type: ignore[attr-defined]
        for node, following in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def _from_class_doc(doc: str, name: str) -> str:
    """The clause of a section's docstring that documents ``name`` ("name: ..." or
    "``name``: ..."), up to the next ';' or sentence end; "" when there is none."""
    found = re.search(rf"(?:^|[\s(])`{{0,2}}{re.escape(name)}`{{0,2}}\s*:\s*(.+?)(?:;|\.\s|$)", doc)
    return found.group(1).strip() if found else ""


def _nested(hint: Any) -> type | None:
    args = typing.get_args(hint) if typing.get_origin(hint) is not None else (hint,)
    found = [a for a in args if isinstance(a, type) and dataclasses.is_dataclass(a)]
    return found[0] if len(found) == 1 else None


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    if dataclasses.is_dataclass(value):
        return "(section)"
    return "null" if value is None else repr(value).replace("|", "\\|")


def _sections(cls: type, path: str) -> list[tuple[str, type, list[tuple[str, str, str, str]]]]:
    """(dotted section path, class, rows of (key, type, default, doc)), depth first."""
    hints = typing.get_type_hints(cls)
    docs = _attribute_docs(cls)
    class_doc = " ".join((inspect.getdoc(cls) or "").split())
    rows, below = [], []
    for f in dataclasses.fields(cls):
        key = key_of(f)
        dotted = f"{path}.{key}" if path else key
        nested = _nested(hints[f.name])
        kind = describe(hints[f.name]).replace("|", "\\|")
        if nested is not None:
            below += _sections(nested, dotted)
            kind = f"section `{dotted}`" + (" or null" if _default(f) == "null" else "")
        doc = docs.get(f.name) or _from_class_doc(class_doc, f.name)
        rows.append((dotted, kind, _default(f), doc.replace("|", "\\|")))
    renamed = getattr(cls, "RENAMED", {})
    for old, new in renamed.items():
        dotted = f"{path}.{old}" if path else old
        rows.append((dotted, "renamed", "", f"renamed to `{new}` (an error says so)"))
    return [(path, cls, rows), *below]


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Every key of the trainer's config (`rl train CONFIG key=value ...`), generated from",
        "the typed config classes by `tools/config_reference.py` (CI checks it is current).",
        "A wrong type, an unknown key or a renamed key at any depth is one `ConfigError`",
        "naming the full dotted path, the value and what is expected, before any worker",
        "starts. Engines, rollout backends and tools check their own options",
        "(`engine_kwargs`, `rollout.tools.<name>`) with the classes they declare",
        "(`options_class`), also before any worker starts.",
        "",
    ]
    for path, cls, rows in _sections(RLConfig, ""):
        title = f"`{path}`" if path else "top level"
        lines += [f"## {title} ({cls.__name__})", ""]
        doc = " ".join((inspect.getdoc(cls) or "").split())
        if doc:
            lines += [doc, ""]
        lines += ["| key | type | default | doc |", "| --- | --- | --- | --- |"]
        lines += [f"| `{k}` | {t} | `{d}` | {doc} |" if d else f"| `{k}` | {t} | | {doc} |"
                  for k, t, d, doc in rows]  # fmt: skip
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is out of date: run python tools/config_reference.py")
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

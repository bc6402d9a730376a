"""`tools/api_snapshot.py` (nox -s api) fails on seeded API changes made without the
right version bump, and passes on the tree as recorded."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import api_snapshot

BASE = "packages/rl-core/src/rl_core/engine/base.py"
CONFIG = "packages/rl-core/src/rl_core/engine/config.py"


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of rl-core (sources, pyproject, CHANGELOG) to seed changes into."""
    shutil.copytree(
        api_snapshot.ROOT / "packages/rl-core",
        tmp_path / "packages/rl-core",
        ignore=shutil.ignore_patterns("tests", "__pycache__"),
    )
    return tmp_path


def _edit(tree: Path, rel: str, old: str, new: str) -> None:
    path = tree / rel
    text = path.read_text()
    assert old in text, f"seed target {old!r} not in {rel}"
    path.write_text(text.replace(old, new, 1))


def _bump(tree: Path, version: str) -> None:
    _edit(tree, "packages/rl-core/pyproject.toml", 'version = "0.1.0"', f'version = "{version}"')
    _edit(
        tree,
        "packages/rl-core/CHANGELOG.md",
        "## 0.1.0 (unreleased)",
        f"## {version} (unreleased)\n\n## 0.1.0",
    )


def test_the_tree_matches_its_recorded_api():
    assert api_snapshot.main([]) == 0


def test_unchanged_copy_passes(tree):
    assert api_snapshot.check("rl-core", root=tree) is None


SEEDS = {
    "parameter renamed": (
        BASE,
        "def build_engine(name: str,",
        "def build_engine(engine_name: str,",
    ),
    "protocol method removed": (
        BASE,
        "    def offload(self) -> None:",
        "    def _offload(self) -> None:",
    ),
    "dataclass field removed": (CONFIG, "    eps: float = 1e-8\n", ""),
    "field annotation changed": (CONFIG, "    eps: float = 1e-8", "    eps: int = 1"),
}


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_breaking_change_needs_a_minor_bump_while_0x(tree, seed):
    rel, old, new = SEEDS[seed]
    _edit(tree, rel, old, new)
    problem = api_snapshot.check("rl-core", root=tree)  # same unreleased version
    assert problem is not None and "record it" in problem, problem
    _bump(tree, "0.1.1")
    problem = api_snapshot.check("rl-core", root=tree)
    assert problem is not None and "breaking API change" in problem, problem
    assert "minor (0.x) bump is required" in problem


def test_breaking_change_with_a_minor_bump_only_needs_recording(tree):
    _edit(tree, *SEEDS["parameter renamed"])
    _bump(tree, "0.2.0")
    assert "valid bump; record it" in api_snapshot.check("rl-core", root=tree)


def test_addition_needs_a_minor_bump(tree):
    _edit(
        tree,
        BASE,
        "def check_outputs(",
        "def new_public_helper() -> None:\n    pass\n\n\ndef check_outputs(",
    )
    _edit(
        tree,
        "packages/rl-core/src/rl_core/engine/__init__.py",
        '    "check_outputs",',
        '    "check_outputs",\n    "new_public_helper",',
    )
    _edit(
        tree,
        "packages/rl-core/src/rl_core/engine/__init__.py",
        "    check_outputs,",
        "    check_outputs,\n    new_public_helper,",
    )
    _bump(tree, "0.1.1")
    problem = api_snapshot.check("rl-core", root=tree)
    assert problem is not None and "a minor bump is required" in problem, problem
    assert "rl_core.engine.new_public_helper" in problem


def test_new_optional_parameter_is_an_addition_not_a_break():
    old = {
        "m.f": {
            "kind": "function",
            "params": [["a", "positional or keyword", "int", False]],
            "returns": "",
        }
    }
    new = {
        "m.f": {
            "kind": "function",
            "params": [
                ["a", "positional or keyword", "int", False],
                ["b", "keyword-only", "int", True],
            ],
            "returns": "",
        }
    }
    added, broken, _ = api_snapshot.diff(old, new)
    assert (added, broken) == ({"m.f"}, set())
    new["m.f"]["params"][1][3] = False  # now required
    added, broken, reasons = api_snapshot.diff(old, new)
    assert broken == {"m.f"} and "new required parameter 'b'" in reasons[0]

"""Repository rules: package layout, the import rule between packages, API versioning."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import api_snapshot  # noqa: E402
import check_imports  # noqa: E402

MEMBERS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["workspace"]["members"]


@pytest.mark.parametrize("member", MEMBERS)
def test_member_layout(member):
    directory = ROOT / member
    meta = tomllib.loads((directory / "pyproject.toml").read_text())["project"]
    module = meta["name"].replace("-", "_")
    assert (directory / "src" / module / "__init__.py").is_file()
    for name in ("README.md", "CHANGELOG.md"):
        assert (directory / name).is_file(), f"{member} lacks {name}"
    assert (directory / "tests").is_dir()
    api_snapshot.parse_version(meta["version"])
    assert f"## {meta['version']}" in (directory / "CHANGELOG.md").read_text(), (
        f"{member}: CHANGELOG.md has no section for version {meta['version']}"
    )
    for dep in meta.get("dependencies", []):
        if dep.startswith("rl-"):
            assert "<" in dep and ">=" in dep, f"{member}: sibling dependency {dep!r} needs a range"


def test_import_rule_holds_for_the_repository():
    assert check_imports.check_tree(ROOT) == []


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_import_rule_catches_each_kind_of_violation(tmp_path):
    core = "packages/rl-core/src/rl_core"
    _write(tmp_path, f"{core}/bad.py", "import ray\nfrom transformers import AutoModel\n")
    _write(tmp_path, f"{core}/single_controller/ray/ok.py", "import ray\n")
    _write(tmp_path, f"{core}/testing/lazy.py", "def f():\n    import transformers\n")
    _write(tmp_path, f"{core}/testing/eager.py", "import vllm\n")
    _write(tmp_path, "packages/rl-engines/src/rl_engines/x.py", "from rl_rollout import y\n")
    _write(tmp_path, "packages/rl-engines/src/rl_engines/z.py", "from rl_core._private import q\n")
    _write(tmp_path, "packages/rl-multimodal/src/rl_multimodal/m.py", "import rl_algos\n")
    found = {(v.path.name, v.module) for v in check_imports.check_tree(tmp_path)}
    assert found == {
        ("bad.py", "ray"),
        ("bad.py", "transformers"),
        ("eager.py", "vllm"),
        ("x.py", "rl_rollout"),
        ("z.py", "rl_core._private"),
    }


def test_import_rule_script_exit_status(tmp_path):
    _write(tmp_path, "packages/rl-core/src/rl_core/bad.py", "import sglang\n")
    script = ROOT / "tools" / "check_imports.py"
    bad = subprocess.run([sys.executable, script, tmp_path], capture_output=True, text=True)
    assert bad.returncode == 1 and "sglang" in bad.stdout
    good = subprocess.run([sys.executable, script, ROOT], capture_output=True, text=True)
    assert good.returncode == 0, good.stdout


def test_import_cycle_fails_the_check_and_is_printed(tmp_path):
    """A planted cycle fails, whichever way its imports are written: at module level, inside
    a function, under TYPE_CHECKING, relative; the parent package is an edge only when named."""
    rollout = "packages/rl-rollout/src/rl_rollout"
    _write(tmp_path, f"{rollout}/__init__.py", "")
    _write(tmp_path, f"{rollout}/a.py", "import rl_rollout\nfrom rl_rollout.b import B\n")
    _write(tmp_path, f"{rollout}/b.py", "def f():\n    from . import c\n")
    _write(tmp_path, f"{rollout}/c.py", "if TYPE_CHECKING:\n    from rl_rollout.a import A\n")
    _write(tmp_path, "packages/rl-core/src/rl_core/leaf.py", "import os\n")
    cycles = check_imports.import_cycles(check_imports.module_graph(tmp_path))
    assert cycles == [["rl_rollout.a", "rl_rollout.b", "rl_rollout.c", "rl_rollout.a"]]
    script = ROOT / "tools" / "check_imports.py"
    bad = subprocess.run([sys.executable, script, tmp_path], capture_output=True, text=True)
    assert bad.returncode == 1
    assert "a.py:2: import of 'rl_rollout.b': import cycle: " in bad.stdout
    assert "rl_rollout.a -> rl_rollout.b -> rl_rollout.c -> rl_rollout.a" in bad.stdout
    _write(tmp_path, f"{rollout}/c.py", "import rl_core.leaf\n")  # the cycle broken
    assert check_imports.check_cycles(tmp_path) == []


def test_no_import_cycle_in_the_repository():
    assert check_imports.import_cycles(check_imports.module_graph(ROOT)) == []


@pytest.mark.parametrize(
    ("old", "new", "added", "removed", "ok"),
    [
        ("0.1.0", "0.1.0", set(), set(), True),
        ("0.1.0", "0.1.0", {"x"}, set(), False),
        ("0.1.0", "0.1.1", {"x"}, set(), False),
        ("0.1.0", "0.2.0", {"x"}, set(), True),
        ("0.1.0", "0.1.1", set(), {"x"}, False),
        ("0.1.0", "0.2.0", set(), {"x"}, True),
        ("1.2.0", "1.2.1", {"x"}, set(), False),
        ("1.2.0", "1.3.0", {"x"}, set(), True),
        ("1.2.0", "1.3.0", set(), {"x"}, False),
        ("1.2.0", "2.0.0", set(), {"x"}, True),
    ],
)
def test_api_change_needs_the_right_bump(old, new, added, removed, ok):
    change = api_snapshot.ApiChange("p", old, new, frozenset(added), frozenset(removed))
    assert (change.problem() is None) is ok


def test_public_api_matches_snapshot():
    """`__all__` of every package equals its recorded snapshot (see tools/api_snapshot.py)."""
    assert api_snapshot.main([]) == 0


@pytest.mark.parametrize("module", sorted(api_snapshot.PACKAGES.values()))
def test_every_exported_name_exists(module):
    mod = importlib.import_module(module)
    missing = [name for name in mod.__all__ if not hasattr(mod, name)]
    assert not missing, f"{module}.__all__ names missing attributes: {missing}"
    assert importlib.util.find_spec(module) is not None

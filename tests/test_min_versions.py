"""tools/min_versions.py: which requirements a leg lowers, and which sibling build it uses.

The leg itself (`nox -s min-versions`) builds and installs real venvs; these tests check
its bookkeeping on synthetic wheels, where the expected answer is written out by hand."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import min_versions  # noqa: E402


def _wheel(tmp: Path, name: str, version: str, requires: list[str]) -> Path:
    path = tmp / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    meta = ["Metadata-Version: 2.4", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", "\n".join(meta))
    return path


def test_closure_follows_siblings_and_extras(tmp_path):
    wheels = {
        "rl-core": _wheel(
            tmp_path,
            "rl-core",
            "0.1.0",
            [
                "torch>=2.6",
                "numpy>=1.26",
                "ray>=2.40; extra == 'ray'",
                "pytest>=8; extra == 'testing'",
            ],
        ),
        "rl-algos": _wheel(
            tmp_path,
            "rl-algos",
            "0.1.0",
            [
                "rl-core[ray]<0.2,>=0.1",
                "omegaconf>=2.4",
                "wandb>=0.17; extra == 'wandb'",
                "rl-algos[wandb]; extra == 'trackers'",
                "uvloop>=0.19; sys_platform == 'linux' and extra == 'fast'",
            ],
        ),
    }
    siblings, lowered = min_versions.closure("rl-algos", set(), wheels)
    assert siblings == {"rl-algos": set(), "rl-core": {"ray"}}
    assert sorted(lowered) == ["numpy>=1.26", "omegaconf>=2.4", "ray>=2.40", "torch>=2.6"]
    siblings, lowered = min_versions.closure("rl-algos", {"trackers", "fast"}, wheels)
    assert siblings["rl-algos"] == {"trackers", "fast", "wandb"}
    assert "wandb>=0.17" in lowered and "uvloop>=0.19 ; sys_platform == 'linux'" in lowered
    assert not any(r.startswith("pytest") for r in lowered)  # rl-core[testing] not asked for


def test_sibling_at_its_lower_bound_comes_from_the_tree(tmp_path):
    tree = {"rl-core": _wheel(tmp_path, "rl-core", "0.1.0", [])}
    assert min_versions.sibling_wheel("rl-core", "<0.2,>=0.1", tree, tmp_path) == tree["rl-core"]
    newer = {"rl-core": _wheel(tmp_path, "rl-core", "0.3.0", [])}
    with pytest.raises(SystemExit, match=r"lowest allowed version 0\.2.*rl-core-v0\.2"):
        min_versions.sibling_wheel("rl-core", ">=0.2,<0.4", newer, tmp_path)


def test_torch_pins_come_from_the_lock():
    pins = min_versions.locked_torch_pins()
    names = {min_versions._canonical(p.split("==")[0]) for p in pins}
    assert "torch" in names and "numpy" not in names and "tensordict" not in names
    dev_torch = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert f"torch=={dev_torch.split('+')[0]}" in pins

"""rl-core's dependency rule, checked at run time (tools/check_imports.py checks the source).

* `import rl_core` loads none of ray, transformers, vllm, sglang, megatron.
* Every rl_core module except the Ray backend imports while those libraries are blocked,
  so rl-core does not need them.
* In the isolated nox session (RL_ISOLATED_SESSION set by noxfile.py) the environment
  itself proves it: `tests-rl-core` has neither ray nor transformers installed, and
  `tests-rl-core-ray` has ray but not transformers. Outside nox (the full dev environment,
  where they are installed) these tests assert only the weaker property (importing rl_core
  loads none of them); they never skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

FORBIDDEN = ("ray", "transformers", "vllm", "sglang", "megatron")
RAY_BACKEND = "rl_core.single_controller.ray"


PROBE = f"""
import importlib, json, pkgutil, sys

import rl_core, rl_core.protocol

after_import = sorted(m for m in sys.modules if m.split(".")[0] in {FORBIDDEN!r})


class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {FORBIDDEN!r}:
            raise ImportError(f"blocked by the test: {{name}}")
        return None


sys.meta_path.insert(0, Block())
imported = []
for info in pkgutil.walk_packages(rl_core.__path__, "rl_core."):
    if info.name == {RAY_BACKEND!r} or info.name.startswith({RAY_BACKEND!r} + "."):
        continue
    importlib.import_module(info.name)
    imported.append(info.name)
print(json.dumps({{"after_import": after_import, "imported": imported}}))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    """One fresh interpreter: what `import rl_core` loads, then every module with the
    forbidden libraries blocked (one subprocess, since importing torch is slow here)."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_import_rl_core_loads_no_heavy_library(probe):
    assert probe["after_import"] == []


def test_rl_core_modules_import_with_heavy_libraries_blocked(probe):
    """Every module but the Ray backend imports while the forbidden libraries cannot load."""
    assert "rl_core.protocol" in probe["imported"]
    assert "rl_core.protocol_transport" in probe["imported"]


def test_isolated_session_lacks_heavy_libraries(probe):
    """tests-rl-core: ray and transformers are not installed at all."""
    if os.environ.get("RL_ISOLATED_SESSION") == "rl-core":
        assert importlib.util.find_spec("ray") is None
        assert importlib.util.find_spec("transformers") is None
    else:
        # Outside the bare session they may be installed; the weaker property still holds.
        assert probe["after_import"] == []


@pytest.mark.ray
def test_ray_session_has_ray_but_not_transformers():
    """tests-rl-core-ray: the [ray] extra brings ray and nothing of the model stack."""
    assert importlib.util.find_spec("ray") is not None
    if os.environ.get("RL_ISOLATED_SESSION") == "rl-core-ray":
        assert importlib.util.find_spec("transformers") is None


def test_import_rl_core_is_lazy():
    """`import rl_core` loads neither torch nor tensordict (nor importlib.metadata); its
    names load their submodules on first use and are the same objects."""
    code = (
        "import sys, json, rl_core\n"
        "before = sorted(m for m in ('torch', 'tensordict', 'numpy') if m in sys.modules)\n"
        "from rl_core.protocol import DataProto\n"
        "same = rl_core.DataProto is DataProto and 'DataProto' in dir(rl_core)\n"
        "print(json.dumps({'before': before, 'same': same, 'version': rl_core.__version__}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out == {"before": [], "same": True, "version": "0.1.0"}, out
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        import rl_core

        rl_core.nope  # noqa: B018

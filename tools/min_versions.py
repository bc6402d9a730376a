"""Minimum-versions check: every package, built and installed at the lowest versions it allows.

    uv run python tools/min_versions.py                  # every package (what `nox -s min-versions` runs)
    uv run python tools/min_versions.py rl-core rl-algos # some of them

For each package this builds its sdist and, from that sdist, its wheel (so a file missing
from the sdist fails here), creates a clean venv and installs the wheel with only what it
declares:

- its third-party requirements (and those of the siblings it needs) at the LOWEST versions
  their ranges allow: they are passed as direct requirements to
  ``uv pip install --resolution lowest-direct``; what they pull in transitively is resolved
  to the newest compatible version, as a user's installer would;
- its sibling packages at the lowest version their ranges allow: the wheel built from this
  tree when the tree's version is that lower bound (every package is unreleased 0.1.0), or
  else the lowest ``<dist>-v<version>`` release tag inside the range, built from that tag;
- torch and its CUDA libraries at the versions uv.lock records (constraints): one torch,
  hard-linked from uv's cache into every venv, so a leg costs seconds, not a 3 GB download.
  torch's own lower bound is therefore not exercised here (PyPI's older CUDA torch builds
  would each be another multi-GB environment): `nox -s tests-torch-floor` runs the engine
  conformance suites and the stand-in device checks at rl-core's declared torch floor.

Then it imports the package and runs a short smoke test (see ``SMOKE``) in that venv.
A lower bound that does not work shows up as an install or smoke failure: raise the bound
in the package's pyproject.toml (and ``uv lock``).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# distribution -> (directory, extras installed with it in its leg)
LEGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "rl-core": ("packages/rl-core", ()),
    "rl-engines": ("packages/rl-engines", ("fsdp",)),
    "rl-rollout": ("packages/rl-rollout", ("hf",)),
    "rl-algos": ("packages/rl-algos", ()),
    "rl-multimodal": ("packages/rl-multimodal", ()),
    "rl-nvidia": ("integrations/nvidia", ()),
    "rl-amd": ("integrations/amd", ()),
    "rl-ascend": ("integrations/ascend", ()),
}
WORKSPACE = set(LEGS)
# Installed from uv.lock's versions, never lowered (see the module docstring).
PINNED_ROOT = "torch"


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, **kwargs)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = [int(p) for p in re.findall(r"\d+", text)[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


# ---------------------------------------------------------------- requirements of a wheel
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;]*?)\s*(;.*)?$")


def wheel_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(name).decode())
    return meta.get_all("Requires-Dist") or []


def split_requirement(req: str) -> tuple[str, set[str], str, str]:
    """(canonical name, extras, specifier, marker) of one Requires-Dist string."""
    match = _REQ.match(req)
    if match is None:
        raise SystemExit(f"cannot read the requirement {req!r}")
    name, extras, spec, marker = match.groups()
    wanted = {e.strip() for e in (extras or "[]")[1:-1].split(",") if e.strip()}
    return _canonical(name), wanted, spec.strip("() "), (marker or "")[1:].strip()


def _extra_of(marker: str) -> str | None:
    found = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
    return found.group(1) if found else None


def _without_extra(marker: str) -> str:
    """The marker with its ``extra == "..."`` clause removed ("" when nothing is left)."""
    rest = re.sub(r"""\s*(and\s+)?extra\s*==\s*["'][^"']+["']\s*(and\s+)?""", " ", marker)
    return rest.strip().removeprefix("and").removesuffix("and").strip()


def closure(
    dist: str, extras: set[str], wheels: dict[str, Path]
) -> tuple[dict[str, set[str]], list[str]]:
    """Siblings needed by ``dist[extras]`` (name -> extras) and the third-party requirement
    strings they declare (the ones to lower), following sibling requirements recursively."""
    siblings: dict[str, set[str]] = {}
    third_party: list[str] = []
    todo, done = [(dist, set(extras))], set()
    while todo:
        name, want = todo.pop()
        have = siblings.setdefault(name, set())
        have |= want
        if (name, frozenset(have)) in done:
            continue
        done.add((name, frozenset(have)))
        for req in wheel_requirements(wheels[name]):
            child, child_extras, spec, marker = split_requirement(req)
            extra = _extra_of(marker)
            if extra is not None and extra not in have:
                continue
            if child in WORKSPACE:
                todo.append((child, child_extras))
                continue
            env_marker = _without_extra(marker)
            line = child + (f"[{','.join(sorted(child_extras))}]" if child_extras else "") + spec
            line += f" ; {env_marker}" if env_marker else ""
            if line not in third_party:
                third_party.append(line)
    return siblings, third_party


# ---------------------------------------------------------------- siblings' lowest versions
def lower_bound(spec: str) -> str | None:
    for clause in spec.split(","):
        clause = clause.strip()
        if clause.startswith((">=", "==", "~=")):
            return clause[2:].strip()
    return None


def sibling_wheel(name: str, spec: str, tree_wheels: dict[str, Path], build_dir: Path) -> Path:
    """The wheel of ``name`` at the lowest version ``spec`` allows: this tree's build when
    its version is that bound, else the lowest release tag inside the range."""
    tree = tree_wheels[name]
    tree_version = tree.name.split("-")[1]
    floor = lower_bound(spec)
    if floor is None or _version_tuple(tree_version) <= _version_tuple(floor):
        return tree
    tags = _run(
        ["git", "tag", "--list", f"{name}-v*"], cwd=ROOT, capture_output=True
    ).stdout.split()
    versions = sorted(
        (t.removeprefix(f"{name}-v") for t in tags),
        key=_version_tuple,
    )
    inside = [v for v in versions if _version_tuple(v) >= _version_tuple(floor)]
    if not inside:
        raise SystemExit(
            f"{name}{spec}: the lowest allowed version {floor} is neither this tree's "
            f"({tree_version}) nor a release tag '{name}-v{floor}': raise the lower bound"
        )
    tag = f"{name}-v{inside[0]}"
    src = build_dir / "tags" / tag
    src.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "archive", tag, LEGS[name][0]], cwd=ROOT, check=True, capture_output=True
    ).stdout
    _run(["tar", "-x", "-C", str(src)], input=archive.decode("latin-1"), encoding="latin-1")
    out = build_dir / "tags-dist"
    _run(["uv", "build", "-q", "--wheel", "--out-dir", str(out), str(src / LEGS[name][0])])
    return next(out.glob(f"{name.replace('-', '_')}-{inside[0]}-*.whl"))


def sibling_spec(dist: str, sibling: str, wheels: dict[str, Path]) -> str:
    """The range ``dist`` (or any sibling in between) declares for ``sibling``."""
    for req in wheel_requirements(wheels[dist]):
        name, _, spec, _ = split_requirement(req)
        if name == sibling:
            return spec
    return ""


# ---------------------------------------------------------------- torch from uv.lock
def locked_torch_pins() -> list[str]:
    """``name==version`` for torch and everything it pulls in, as uv.lock resolves rl-core."""
    exported = _run(
        [
            "uv", "export", "--locked", "--package", "rl-core", "--no-hashes",
            "--no-emit-workspace", "--no-default-groups", "--no-header", "-q",
        ],
        cwd=ROOT, capture_output=True,
    ).stdout  # fmt: skip
    lines = {
        _canonical(line.split("==")[0]): line.strip()
        for line in exported.splitlines()
        if "==" in line and not line.lstrip().startswith("#")
    }
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    by_name: dict[str, list[dict]] = {}
    for package in lock["package"]:
        by_name.setdefault(_canonical(package["name"]), []).append(package)
    names, todo = set(), [PINNED_ROOT]
    while todo:
        name = todo.pop()
        if name in names or name not in lines:
            continue
        names.add(name)
        version = lines[name].split("==")[1].split(";")[0].strip()
        for package in by_name.get(name, []):
            if package["version"] == version:
                todo += [_canonical(d["name"]) for d in package.get("dependencies", [])]
    return [lines[n] for n in sorted(names)]


# ---------------------------------------------------------------- one leg
def run_leg(dist: str, wheels: dict[str, Path], work: Path, pins: Path) -> float:
    start = time.perf_counter()
    extras = LEGS[dist][1]
    siblings, third_party = closure(dist, set(extras), wheels)
    venv = work / f"venv-{dist}"
    _run(["uv", "venv", "-q", "--clear", "--python", "3.11", str(venv)])
    python = str(venv / "bin" / "python")
    targets = []
    for name, wanted in sorted(siblings.items()):
        if name == dist:
            wheel = wheels[name]
        else:
            spec = next((s for d in siblings if (s := sibling_spec(d, name, wheels))), "")
            wheel = sibling_wheel(name, spec, wheels, work)
        suffix = f"[{','.join(sorted(wanted))}]" if wanted else ""
        targets.append(f"{name}{suffix} @ {wheel.resolve().as_uri()}")
    reqs = work / f"{dist}-requirements.txt"
    reqs.write_text("\n".join(targets + third_party) + "\n")
    print(f"\n== {dist}{'[' + ','.join(extras) + ']' if extras else ''}: lowest of", flush=True)
    print("   " + "\n   ".join(third_party), flush=True)
    _run([
        "uv", "pip", "install", "-q", "--python", python, "--resolution", "lowest-direct",
        "--constraint", str(pins), "-r", str(reqs),
    ])  # fmt: skip
    names = [split_requirement(r)[0] for r in third_party]
    freeze = _run(["uv", "pip", "freeze", "--python", python], capture_output=True).stdout
    chosen = [line for line in freeze.splitlines() if _canonical(line.split("==")[0]) in names]
    print("   installed: " + ", ".join(chosen), flush=True)
    _run([python, str(Path(__file__).resolve()), "--smoke", dist], cwd=work)
    took = time.perf_counter() - start
    print(f"   {dist}: ok in {took:.0f} s", flush=True)
    return took


# ---------------------------------------------------------------- smoke tests (in the venv)
def _smoke_rl_core() -> None:
    import pickle

    import torch

    import rl_core
    from rl_core import DataProto

    data = DataProto.from_dict(
        tensors={"input_ids": torch.arange(12).reshape(4, 3), "mask": torch.ones(4, 3)},
        non_tensors={"uid": ["a", "b", "c", "d"]},
        meta_info={"step": 1},
    )
    back = pickle.loads(pickle.dumps(DataProto.concat(data.chunk(2))))
    assert torch.equal(back.batch["input_ids"], data.batch["input_ids"])
    assert list(back.non_tensor_batch["uid"]) == ["a", "b", "c", "d"]
    assert back.meta_info == {"step": 1}
    assert rl_core.__version__


def _smoke_rl_engines() -> None:
    import rl_engines
    from rl_core.engine import ENGINES

    assert "fsdp" in ENGINES.names()
    ENGINES.get("fsdp")  # imports the fsdp engine: transformers, safetensors
    assert rl_engines.__version__


def _smoke_rl_rollout() -> None:
    import rl_rollout
    from rl_core.rollout import ROLLOUTS

    ROLLOUTS.get("hf")  # imports the HF backend: transformers, pillow
    import rl_rollout.agent_loop.tool_loop

    assert rl_rollout.__version__


def _smoke_rl_algos() -> None:
    import torch

    from rl_algos import compute_advantage, load_config
    from rl_core import DataProto

    cfg = load_config(ROOT / "examples" / "grpo_tiny.yaml", ["rollout.n=2"])
    assert cfg.rollout.n == 2 and cfg.algorithm.adv_estimator == "grpo"
    data = DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
            "response_mask": torch.ones(2, 2),
        },
        non_tensors={"uid": ["q", "q"]},
    )
    compute_advantage(data, "grpo")
    adv = data.batch["advantages"][:, 0]
    # rewards 1 and 0 in one group: mean 0.5, unbiased std 0.7071 -> +-0.7071
    assert torch.allclose(adv, torch.tensor([0.70710677, -0.70710677]), atol=1e-4), adv
    from rl_algos.rewards.math_answer import answers_equal

    assert answers_equal(r"\sqrt{4}", "2")  # math-verify at its lowest allowed version


def _smoke_rl_multimodal() -> None:
    import io

    import numpy as np
    from PIL import Image

    import rl_multimodal
    from rl_multimodal.vla.action_tokenizer import ActionTokenizer
    from rl_multimodal.vlm.shapes import draw_shapes

    png = draw_shapes(16, ("r", "square", 2, 2, 8), [("b", "disc", 11, 11, 3)])
    assert Image.open(io.BytesIO(png)).getpixel((5, 5)) == (230, 40, 40)
    tok = ActionTokenizer(low=[-1.0], high=[1.0], n_bins=4, vocab_size=10)
    # bins of width 0.5 over [-1, 1] on ids 6..9: -0.9 -> bin 0, 0.6 -> bin 3
    assert tok.encode(np.array([[-0.9], [0.6]])).ravel().tolist() == [6, 9]
    assert rl_multimodal.__version__


def _smoke_platform(module: str, name: str) -> None:
    import importlib

    from rl_core.platform import PLATFORMS

    importlib.import_module(module)
    assert name in PLATFORMS.names()
    PLATFORMS.get(name)


SMOKE = {
    "rl-core": _smoke_rl_core,
    "rl-engines": _smoke_rl_engines,
    "rl-rollout": _smoke_rl_rollout,
    "rl-algos": _smoke_rl_algos,
    "rl-multimodal": _smoke_rl_multimodal,
    "rl-nvidia": lambda: _smoke_platform("rl_nvidia", "cuda"),
    "rl-amd": lambda: _smoke_platform("rl_amd", "rocm"),
    "rl-ascend": lambda: _smoke_platform("rl_ascend", "npu"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="*", help=f"default: all of {list(LEGS)}")
    parser.add_argument("--work", type=Path, help="build/venv directory (default: a temp dir)")
    parser.add_argument("--smoke", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        SMOKE[args.smoke]()
        print(f"   {args.smoke}: smoke test passed", flush=True)
        return 0
    unknown = [p for p in args.packages if p not in LEGS]
    if unknown:
        parser.error(f"unknown package(s) {unknown}: expected some of {list(LEGS)}")
    chosen = args.packages or list(LEGS)
    with tempfile.TemporaryDirectory(prefix="min-versions-") as tmp:
        work = (args.work or Path(tmp)).resolve()
        dist = work / "dist"
        start = time.perf_counter()
        for name in LEGS:  # sdist, then the wheel from the sdist (uv build's default)
            _run(["uv", "build", "-q", "--out-dir", str(dist), str(ROOT / LEGS[name][0])])
        wheels = {name: next(dist.glob(f"{name.replace('-', '_')}-*.whl")) for name in LEGS}
        pins = work / "torch-pins.txt"
        pins.write_text("\n".join(locked_torch_pins()) + "\n")
        print(f"built {len(wheels)} wheels and sdists in {time.perf_counter() - start:.0f} s")
        times = {name: run_leg(name, wheels, work, pins) for name in chosen}
    print("\nminimum versions: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()))
    print(f"total {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

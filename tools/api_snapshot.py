"""Guard each package's public API against its version (static analysis with griffe).

The public API of a package is every public module (no ``_``-prefixed part, no tests) and
in each one the names of its ``__all__`` (or, without ``__all__``, its own public
definitions): function signatures (parameter names, kinds, annotations, which have
defaults; return annotations), classes (bases, public methods, properties, attributes and
dataclass fields: the protocol methods and config fields other packages build on) and
module attributes. It is compared with a baseline:

* the package's last release tag ``<dist>-v<version>`` (the tree at that tag), or
* before the first release, the recorded snapshot ``tools/api/<dist>.json``.

A breaking change (something removed, a parameter removed/renamed/reordered/made
required, an annotation or base changed) needs a major bump (minor while 0.x); an
addition needs a minor bump. While the version equals the baseline's and is unreleased
(CHANGELOG ``## X.Y.Z (unreleased)``), the API is open but must be recorded: any
difference fails until ``uv run python tools/api_snapshot.py --update`` regenerates the
snapshots (never edit them by hand).

    uv run python tools/api_snapshot.py            # check (nox -s api)
    uv run python tools/api_snapshot.py --update   # record the current API
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT_DIR = ROOT / "tools" / "api"
PACKAGE_DIRS = {
    "rl-core": "packages/rl-core",
    "rl-engines": "packages/rl-engines",
    "rl-rollout": "packages/rl-rollout",
    "rl-algos": "packages/rl-algos",
    "rl-multimodal": "packages/rl-multimodal",
    "rl-nvidia": "integrations/nvidia",
    "rl-amd": "integrations/amd",
    "rl-ascend": "integrations/ascend",
}
PACKAGES = {dist: dist.replace("-", "_") for dist in PACKAGE_DIRS}

# ---- versions -------------------------------------------------------------------------


def parse_version(text: str) -> tuple[int, int, int]:
    parts = text.split("+")[0].split(".")
    if len(parts) < 3 or not all(p.isdigit() for p in parts[:3]):
        raise ValueError(f"version {text!r}: expected MAJOR.MINOR.PATCH")
    major, minor, patch = (int(p) for p in parts[:3])
    return major, minor, patch


def package_version(package: str, root: Path = ROOT) -> str:
    with open(root / PACKAGE_DIRS[package] / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


def is_unreleased(package: str, version: str, root: Path = ROOT) -> bool:
    changelog = (root / PACKAGE_DIRS[package] / "CHANGELOG.md").read_text()
    return f"## {version} (unreleased)" in changelog


@dataclass(frozen=True)
class ApiChange:
    package: str
    old_version: str
    new_version: str
    added: frozenset[str]
    removed: frozenset[str]  # everything breaking: removed or incompatibly changed
    details: tuple[str, ...] = field(default=())

    def problem(self) -> str | None:
        """Why this change is not allowed as versioned, or None when it is."""
        if not self.added and not self.removed:
            return None
        old, new = parse_version(self.old_version), parse_version(self.new_version)
        went = f"the version went {self.old_version} -> {self.new_version}"
        if self.removed:
            breaking_bump = new[:2] > old[:2] if old[0] == 0 else new[0] > old[0]
            if not breaking_bump:
                need = "minor (0.x)" if old[0] == 0 else "major"
                shown = "; ".join(self.details) or ", ".join(sorted(self.removed))
                return f"{self.package}: breaking API change ({shown}) but {went}; a {need} bump is required"
        elif new[:2] <= old[:2]:
            return (
                f"{self.package}: API additions {sorted(self.added)} but {went}; a minor bump "
                "is required"
            )
        return None


# ---- the public surface -------------------------------------------------------------


def _public_module(path: str) -> bool:
    parts = path.split(".")
    return not any(p.startswith("_") or p in ("tests", "conftest") for p in parts[1:])


def _signature(fn: Any) -> dict[str, Any]:
    params = [
        [p.name, p.kind.value, str(p.annotation or ""), p.default is not None]
        for p in fn.parameters
        if p.name not in ("self", "cls")
    ]
    return {"kind": "function", "params": params, "returns": str(fn.returns or "")}


def _describe(obj: Any, prefix: str, out: dict[str, Any]) -> None:
    if obj.is_alias:
        try:
            obj = obj.final_target
        except Exception:  # an unresolvable re-export (e.g. from an extra's library)
            out[prefix] = {"kind": "alias", "target": str(obj.target_path)}
            return
    kind = obj.kind.value
    if kind == "function":
        desc = _signature(obj)
        if "property" in obj.labels:
            desc = {"kind": "property", "returns": desc["returns"]}
        out[prefix] = desc
    elif kind == "class":
        out[prefix] = {"kind": "class", "bases": [str(b) for b in obj.bases]}
        for name, member in obj.members.items():
            if name.startswith("_") and name != "__init__" and name != "__call__":
                continue
            if member.is_alias:
                continue
            _describe(member, f"{prefix}.{name}", out)
    elif kind == "attribute":
        out[prefix] = {"kind": "attribute", "annotation": str(obj.annotation or "")}
    elif kind == "module":
        out[prefix] = {"kind": "module"}


def surface(package: str, root: Path = ROOT) -> dict[str, Any]:
    """Path -> description of everything public in ``package`` under ``root``."""
    import griffe

    src = root / PACKAGE_DIRS[package] / "src"
    top = griffe.load(PACKAGES[package], search_paths=[str(src)], allow_inspection=False)
    out: dict[str, Any] = {}
    stack = [top]
    while stack:
        module = stack.pop()
        if not _public_module(module.path):
            continue
        stack.extend(m for m in module.modules.values() if not m.is_alias)
        if module.exports is not None:
            names = [str(n) for n in module.exports]
        else:
            names = [
                n
                for n, m in module.members.items()
                if not n.startswith("_") and not m.is_alias and m.kind.value != "module"
            ]
        out[module.path] = {"kind": "module", "exports": sorted(names)}
        for name in names:
            member = module.members.get(name)
            if member is None:  # e.g. __version__ from a lazy __getattr__
                out[f"{module.path}.{name}"] = {"kind": "dynamic"}
                continue
            _describe(member, f"{module.path}.{name}", out)
    return dict(sorted(out.items()))


def _param_breaks(old: list, new: list) -> list[str]:
    problems = []
    new_by_name = {p[0]: (i, p) for i, p in enumerate(new)}
    for i, (name, kind, annotation, has_default) in enumerate(old):
        if name not in new_by_name:
            if kind not in ("variadic positional", "variadic keyword"):
                problems.append(f"parameter {name!r} removed")
            continue
        j, (_, nkind, nannotation, nhas_default) = new_by_name[name]
        if nkind != kind:
            problems.append(f"parameter {name!r} became {nkind}")
        elif "positional" in kind and j != i:
            problems.append(f"parameter {name!r} moved from position {i} to {j}")
        if annotation != nannotation:
            problems.append(f"parameter {name!r} annotation {annotation!r} -> {nannotation!r}")
        if has_default and not nhas_default:
            problems.append(f"parameter {name!r} lost its default")
    old_names = {p[0] for p in old}
    for name, kind, _, has_default in new:
        if name not in old_names and not has_default and "variadic" not in kind:
            problems.append(f"new required parameter {name!r}")
    return problems


def diff(old: dict[str, Any], new: dict[str, Any]) -> tuple[set[str], set[str], list[str]]:
    """(added paths, broken paths, human-readable reasons) from ``old`` to ``new``."""
    added, broken, reasons = set(), set(), []
    for path, before in old.items():
        after = new.get(path)
        if after is None:
            broken.add(path)
            reasons.append(f"{path} removed")
            continue
        why: list[str] = []
        if after["kind"] != before["kind"]:
            why.append(f"{before['kind']} became {after['kind']}")
        elif before["kind"] == "function":
            why += _param_breaks(before["params"], after["params"])
            if before["returns"] != after["returns"]:
                why.append(f"return annotation {before['returns']!r} -> {after['returns']!r}")
        elif before["kind"] == "class" and not set(before["bases"]) <= set(after["bases"]):
            why.append(f"bases {before['bases']} -> {after['bases']}")
        elif before["kind"] in ("attribute", "property") and before != after:
            why.append(f"{before} -> {after}")
        elif before["kind"] == "module":
            gone = sorted(set(before["exports"]) - set(after["exports"]))
            if gone:
                why.append(f"no longer exports {gone}")
            if set(after["exports"]) - set(before["exports"]):
                added.add(path)
        if why:
            broken.add(path)
            reasons += [f"{path}: {w}" for w in why]
        elif before["kind"] == "function" and before != after:
            added.add(path)  # e.g. a new optional parameter
    added |= set(new) - set(old)
    return added, broken, reasons


# ---- baselines ----------------------------------------------------------------------


def release_tag(package: str) -> str | None:
    """The newest ``<dist>-v<version>`` tag, or None before the first release."""
    out = subprocess.run(
        ["git", "tag", "--list", f"{package}-v*", "--sort=-v:refname"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    tags = [t for t in out.stdout.split() if t]
    return tags[0] if tags else None


def surface_at_tag(package: str, tag: str) -> dict[str, Any]:
    archive = subprocess.run(
        ["git", "archive", "--format=tar", tag, PACKAGE_DIRS[package]],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        return surface(package, Path(tmp))


def check(package: str, root: Path = ROOT, snapshot_dir: Path = SNAPSHOT_DIR) -> str | None:
    """The problem with ``package``'s API under ``root``, or None."""
    version = package_version(package, root)
    new = surface(package, root)
    tag = release_tag(package) if root == ROOT else None
    if tag is not None:
        old, old_version = surface_at_tag(package, tag), tag.rsplit("-v", 1)[1]
    else:
        path = snapshot_dir / f"{package}.json"
        if not path.exists():
            return f"{package}: no API snapshot; run tools/api_snapshot.py --update"
        recorded = json.loads(path.read_text())
        if "surface" not in recorded:
            return f"{package}: snapshot in an old format; run tools/api_snapshot.py --update"
        old, old_version = recorded["surface"], recorded["version"]
    added, broken, reasons = diff(old, new)
    if not added and not broken:
        return None
    if tag is None and old_version == version and is_unreleased(package, version, root):
        return (
            f"{package}: the API of unreleased {version} changed ({'; '.join(reasons[:5]) or sorted(added)[:5]}"
            f"{' ...' if len(reasons) > 5 else ''}): record it with "
            "`uv run python tools/api_snapshot.py --update`"
        )
    change = ApiChange(
        package, old_version, version, frozenset(added), frozenset(broken), tuple(reasons[:10])
    )
    if (problem := change.problem()) is not None:
        return problem
    if tag is None:
        return f"{package}: API changed with a valid bump; record it with --update"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="record the current API")
    parser.add_argument("packages", nargs="*", help="distributions (default: all)")
    args = parser.parse_args(argv)
    SNAPSHOT_DIR.mkdir(parents=True, exist_ok=True)
    problems = []
    for package in args.packages or PACKAGES:
        if args.update:
            data = {"version": package_version(package), "surface": surface(package)}
            (SNAPSHOT_DIR / f"{package}.json").write_text(json.dumps(data, indent=1) + "\n")
            continue
        if (problem := check(package)) is not None:
            problems.append(problem)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""Record or check each package's public API (`__all__`) against its version.

The snapshot (`tools/api/<package>.json`) holds the version and the exported names. A
change to `__all__` must come with the right version bump:
  * a removed name is breaking: a major bump (a minor bump while the version is 0.x);
  * an added name is a feature: a minor bump (any bump while 0.x).
While a version is unreleased (its CHANGELOG heading reads "## X.Y.Z (unreleased)"), its
API is still open and may change freely. After bumping or releasing, run
`uv run python tools/api_snapshot.py --update` to record the new API.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

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
PACKAGES = {
    "rl-core": "rl_core",
    "rl-engines": "rl_engines",
    "rl-rollout": "rl_rollout",
    "rl-algos": "rl_algos",
    "rl-multimodal": "rl_multimodal",
    "rl-nvidia": "rl_nvidia",
    "rl-amd": "rl_amd",
    "rl-ascend": "rl_ascend",
}


def parse_version(text: str) -> tuple[int, int, int]:
    parts = text.split("+")[0].split(".")
    if len(parts) < 3 or not all(p.isdigit() for p in parts[:3]):
        raise ValueError(f"version {text!r}: expected MAJOR.MINOR.PATCH")
    major, minor, patch = (int(p) for p in parts[:3])
    return major, minor, patch


@dataclass(frozen=True)
class ApiChange:
    package: str
    old_version: str
    new_version: str
    added: frozenset[str]
    removed: frozenset[str]

    def problem(self) -> str | None:
        """Why this change is not allowed as versioned, or None when it is."""
        if not self.added and not self.removed:
            return None
        old, new = parse_version(self.old_version), parse_version(self.new_version)
        if self.removed:
            breaking = new[:2] > old[:2] if old[0] == 0 else new[0] > old[0]
            if not breaking:
                need = "minor (0.x)" if old[0] == 0 else "major"
                return (
                    f"{self.package}: removed {sorted(self.removed)} from __all__ but the version "
                    f"went {self.old_version} -> {self.new_version}; a {need} bump is required"
                )
        elif new <= old or (old[0] > 0 and new[:2] <= old[:2]):
            return (
                f"{self.package}: added {sorted(self.added)} to __all__ but the version "
                f"went {self.old_version} -> {self.new_version}; bump the version "
                f"({'any bump while 0.x' if old[0] == 0 else 'minor'})"
            )
        return None


def is_unreleased(package: str, version: str) -> bool:
    changelog = (ROOT / PACKAGE_DIRS[package] / "CHANGELOG.md").read_text()
    return f"## {version} (unreleased)" in changelog


def current(package: str) -> tuple[str, list[str]]:
    from importlib.metadata import version

    module = importlib.import_module(PACKAGES[package])
    return version(package), sorted(module.__all__)


def compare(package: str, snapshot: dict, version: str, names: list[str]) -> ApiChange:
    old = set(snapshot["names"])
    return ApiChange(
        package=package,
        old_version=snapshot["version"],
        new_version=version,
        added=frozenset(set(names) - old),
        removed=frozenset(old - set(names)),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="record the current API")
    args = parser.parse_args(argv)
    SNAPSHOT_DIR.mkdir(parents=True, exist_ok=True)
    problems = []
    for package in PACKAGES:
        version, names = current(package)
        path = SNAPSHOT_DIR / f"{package}.json"
        if args.update:
            path.write_text(json.dumps({"version": version, "names": names}, indent=1) + "\n")
            continue
        if not path.exists():
            problems.append(f"{package}: no API snapshot; run tools/api_snapshot.py --update")
            continue
        snapshot = json.loads(path.read_text())
        if snapshot["version"] == version and is_unreleased(package, version):
            continue  # the API of an unreleased version is still open
        change = compare(package, snapshot, version, names)
        if (problem := change.problem()) is not None:
            problems.append(problem)
        elif change.added or change.removed:
            problems.append(
                f"{package}: __all__ changed with a valid bump; record it with --update"
            )
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

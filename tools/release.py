"""Release one package: set its version, date its CHANGELOG heading, record its API, commit
and tag ``<dist>-v<version>``.

    uv run python tools/release.py rl-core                 # release the unreleased version
    uv run python tools/release.py rl-engines --bump minor  # 0.1.0 -> 0.2.0, then release
    uv run python tools/release.py rl-algos --version 1.0.0

The working tree must be clean and the tag new. The CHANGELOG's
``## <current version> (unreleased)`` heading becomes ``## <version> (<date>)``; ``uv lock``
records the new version (``--skip-lock`` leaves it to you); the API snapshot of the package
is regenerated (`tools/api_snapshot.py`). Pushing the commit and the tag is left to you.
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import api_snapshot

ROOT = api_snapshot.ROOT


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


def next_version(current: str, bump: str | None, explicit: str | None) -> str:
    if explicit:
        api_snapshot.parse_version(explicit)
        return explicit
    major, minor, patch = api_snapshot.parse_version(current)
    return {
        None: current,
        "major": f"{major + 1}.0.0",
        "minor": f"{major}.{minor + 1}.0",
        "patch": f"{major}.{minor}.{patch + 1}",
    }[bump]


def release(dist: str, bump: str | None, explicit: str | None, date: str, lock: bool) -> str:
    if dist not in api_snapshot.PACKAGE_DIRS:
        raise SystemExit(
            f"unknown package {dist!r}: expected one of {list(api_snapshot.PACKAGE_DIRS)}"
        )
    if _git("status", "--porcelain"):
        raise SystemExit("the working tree has uncommitted changes: commit or stash them first")
    current = api_snapshot.package_version(dist)
    version = next_version(current, bump, explicit)
    if api_snapshot.parse_version(version) < api_snapshot.parse_version(current):
        raise SystemExit(f"{dist}: version {version} is lower than the current {current}")
    tag = f"{dist}-v{version}"
    if _git("tag", "--list", tag):
        raise SystemExit(f"tag {tag} already exists")
    directory = ROOT / api_snapshot.PACKAGE_DIRS[dist]
    changelog = directory / "CHANGELOG.md"
    text = changelog.read_text()
    heading = f"## {current} (unreleased)"
    if heading not in text:
        raise SystemExit(
            f"{changelog.relative_to(ROOT)} has no '{heading}' heading: write the changes of "
            "this release under it first"
        )
    changelog.write_text(text.replace(heading, f"## {version} ({date})", 1))
    pyproject = directory / "pyproject.toml"
    pyproject.write_text(
        re.sub(r'(?m)^version = "[^"]+"$', f'version = "{version}"', pyproject.read_text(), count=1)
    )
    if lock:
        subprocess.run(["uv", "lock", "-q"], cwd=ROOT, check=True)
    api_snapshot.main(["--update", dist])
    _git("add", "-A")
    _git("commit", "-q", "-m", f"release {dist} {version}")
    _git("tag", "-a", tag, "-m", f"{dist} {version}")
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dist", help="distribution name, e.g. rl-core")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--bump", choices=("major", "minor", "patch"))
    group.add_argument("--version", dest="explicit")
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument("--skip-lock", action="store_true", help="do not run `uv lock`")
    args = parser.parse_args(argv)
    tag = release(args.dist, args.bump, args.explicit, args.date, lock=not args.skip_lock)
    print(f"tagged {tag}; push with: git push origin HEAD {tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""tools/release.py in a temporary clone: bump, CHANGELOG heading, snapshot, commit, tag;
afterwards the API guard compares against the new tag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=check)


def test_release_in_a_temporary_clone(tmp_path):
    clone = tmp_path / "clone"
    _run("git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone), cwd=tmp_path)
    for key, value in (("user.email", "t@example.com"), ("user.name", "t")):
        _run("git", "config", key, value, cwd=clone)
    release = [sys.executable, "tools/release.py", "rl-engines", "--skip-lock"]
    out = _run(*release, "--bump", "minor", "--date", "2026-01-02", cwd=clone)
    assert "tagged rl-engines-v0.2.0" in out.stdout
    pyproject = (clone / "packages/rl-engines/pyproject.toml").read_text()
    assert 'version = "0.2.0"' in pyproject
    changelog = (clone / "packages/rl-engines/CHANGELOG.md").read_text()
    assert "## 0.2.0 (2026-01-02)" in changelog and "(unreleased)" not in changelog
    assert '"version": "0.2.0"' in (clone / "tools/api/rl-engines.json").read_text()
    head = _run("git", "rev-parse", "HEAD", cwd=clone).stdout
    tagged = _run("git", "rev-parse", "rl-engines-v0.2.0^{commit}", cwd=clone).stdout
    assert head == tagged
    assert _run("git", "status", "--porcelain", cwd=clone).stdout == ""
    # the guard now compares rl-engines with its tag: unchanged, so it passes
    assert _run(sys.executable, "tools/api_snapshot.py", "rl-engines", cwd=clone).returncode == 0
    # the same tag again, and a dirty tree, are refused
    again = _run(*release, "--version", "0.2.0", cwd=clone, check=False)
    assert again.returncode != 0 and "already exists" in again.stderr
    (clone / "README.md").write_text("dirty")
    dirty = _run(*release, "--bump", "patch", cwd=clone, check=False)
    assert dirty.returncode != 0 and "uncommitted changes" in dirty.stderr

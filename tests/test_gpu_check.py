"""`benchmarks/gpu_check.py`: every GPU check's CPU half runs on CPU (`--dry-run`, so the
one command for a lent GPU does not rot between loans), the table lists every check, and a
check that cannot run is reported failed (or skipped by `--skip`), never passed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKS = (
    "gpu-tests",
    "grpo",
    "sharded-loader",
    "fsdp-vs-plain",
    "offload",
    "checkpoint",
    "megatron",
    "vlm",
    "lora",
)


def _gpu_check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", *args],
        cwd=ROOT,
        env={**os.environ, "RAY_AUTH_MODE": "disabled", **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_gpu_check_dry_run():
    results = ROOT / "docs" / "gpu-results.md"
    before = results.read_text()
    proc = _gpu_check("--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    table = proc.stdout.splitlines()
    assert table[0].split() == ["check", "result", "goal", "verdict"], table
    rows = table[1:-1]
    assert tuple(line.split()[0] for line in rows) == CHECKS, rows
    assert all(line.rstrip().endswith("ran") for line in rows), rows
    assert table[-1] == f"ran: {', '.join(CHECKS)} failed: - skipped: -", table[-1]
    offload = next(line for line in table if line.startswith("offload"))
    assert "stand-in device: 100% of" in offload, offload  # freed on the non-host device
    loader = next(line for line in table if line.startswith("sharded-loader"))
    assert "sharded loader;" in loader and "NOT" not in loader, loader
    assert results.read_text() == before  # a dry run records nothing


def test_a_check_that_cannot_run_fails_unless_skipped(tmp_path):
    """megatron-core absent (a `megatron` package without `core` first on the path): the
    megatron check fails, in a dry run too; `--skip megatron` reports it skipped."""
    fake = tmp_path / "megatron"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = _gpu_check("--dry-run", "--only", "megatron", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("megatron"))
    assert "not installed" in row and row.rstrip().endswith("FAIL"), row
    assert proc.stdout.splitlines()[-1] == "ran: - failed: megatron skipped: -"
    proc = _gpu_check("--dry-run", "--only", "megatron", "--skip", "megatron", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == "ran: - failed: - skipped: megatron"
    proc = _gpu_check("--dry-run", "--skip", "megatorn")
    assert proc.returncode == 2 and "unknown check(s) ['megatorn']" in proc.stderr

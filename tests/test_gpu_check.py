"""`benchmarks/gpu_check.py --dry-run`: every GPU check's CPU half runs on CPU (so the one
command for a lent GPU does not rot between loans) and the table lists every check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ("gpu-tests", "grpo", "fsdp-vs-plain", "offload", "megatron", "vlm", "lora")


def test_gpu_check_dry_run(tmp_path):
    results = ROOT / "docs" / "gpu-results.md"
    before = results.read_text()
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    table = proc.stdout.splitlines()
    assert table[0].split() == ["check", "result", "goal", "pass/fail"], table
    names = [line.split()[0] for line in table[1:]]
    assert tuple(names) == CHECKS, names
    assert "FAIL" not in proc.stdout
    offload = next(line for line in table if line.startswith("offload"))
    assert "stand-in device: 100% of" in offload, offload  # freed on the non-host device
    assert results.read_text() == before  # a dry run records nothing

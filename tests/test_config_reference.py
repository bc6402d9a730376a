"""docs/config-reference.md is what tools/config_reference.py generates from the config
classes: a key added, renamed or re-documented without regenerating it fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_reference_is_current_and_names_every_section():
    run = subprocess.run(
        [sys.executable, "tools/config_reference.py", "--check"], cwd=ROOT, capture_output=True,
        text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    text = (ROOT / "docs" / "config-reference.md").read_text()
    for key in ("actor.optim.lr", "rollout.temperature", "async.max_staleness",
                "critic.placement", "trainer.placement"):  # fmt: skip
        assert f"| `{key}` |" in text, key
    assert "renamed to `critic.placement`" in text

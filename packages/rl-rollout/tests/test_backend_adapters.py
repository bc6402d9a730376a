"""The vLLM and SGLang adapters' translations (pure functions), without either installed."""

import dataclasses
import importlib.util

import pytest

from rl_core.registry import PluginLoadError
from rl_core.rollout import ROLLOUTS, RolloutConfig, SamplingParams, build_rollout_engine
from rl_rollout.backends.sglang_engine import (
    sglang_engine_kwargs,
    sglang_output,
    sglang_sampling_params,
)
from rl_rollout.backends.vllm_engine import (
    _sampled_log_probs,
    vllm_engine_args,
    vllm_sampling_kwargs,
)

HAS_VLLM = importlib.util.find_spec("vllm") is not None
HAS_SGLANG = importlib.util.find_spec("sglang") is not None


def test_the_three_backends_are_registered_by_name():
    assert {"hf", "vllm", "sglang"} <= set(ROLLOUTS.names())


# ---------------------------------------------------------------- vLLM
def test_vllm_engine_args_from_rollout_config():
    config = RolloutConfig(
        model_path="/m",
        backend="vllm",
        tensor_parallel_size=2,
        max_model_len=1024,
        seed=7,
        max_num_seqs=64,
        engine_kwargs={
            "gpu_memory_utilization": 0.6,
            "weight_bucket_bytes": 1 << 20,
            "kv_cache_dtype": "fp8",
        },
    )
    args = vllm_engine_args(config, sleep_mode_available=True)
    assert args["model"] == "/m" and args["skip_tokenizer_init"] is True
    assert args["tensor_parallel_size"] == 2 and args["max_model_len"] == 1024
    assert args["seed"] == 7 and args["gpu_memory_utilization"] == 0.6
    assert args["max_num_seqs"] == 64
    assert args["enforce_eager"] is False  # CUDA graphs by default on an accelerator
    assert args["logprobs_mode"] == "processed_logprobs"
    assert args["generation_config"] == "vllm"
    assert args["worker_extension_cls"] == "rl_rollout.backends.vllm_worker.RLWorkerExtension"
    assert args["enable_sleep_mode"] is True
    assert args["kv_cache_dtype"] == "fp8"  # other engine_kwargs pass through
    assert "weight_bucket_bytes" not in args  # our own options do not
    assert vllm_engine_args(config, sleep_mode_available=False)["enable_sleep_mode"] is False
    assert "enable_chunked_prefill" not in args
    assert vllm_engine_args(config, sleep_mode_available=False, cpu=True)["enforce_eager"] is True
    eager = dataclasses.replace(config, engine_kwargs={"enforce_eager": True})
    assert vllm_engine_args(eager, sleep_mode_available=False)["enforce_eager"] is True


@pytest.mark.parametrize("key", ["tensor_parallel_size", "tp_size"])
def test_engine_kwargs_cannot_override_the_tensor_parallel_size(key):
    """The weight senders (NcclPoolSender) read rollout.tensor_parallel_size: an override in
    engine_kwargs would desync them from the engine."""
    config = RolloutConfig(model_path="/m", engine_kwargs={key: 2})
    pattern = rf"^engine_kwargs\.{key}: invalid value 2; expected .*rollout.tensor_parallel_size"
    with pytest.raises(ValueError, match=pattern):
        vllm_engine_args(config, False)
    with pytest.raises(ValueError, match=pattern):
        sglang_engine_kwargs(config)


def test_vllm_engine_args_select_the_native_weight_transfer_backend():
    config = RolloutConfig(
        model_path="/m", backend="vllm", engine_kwargs={"weight_transfer": "nccl"}
    )
    assert "weight_transfer_config" not in vllm_engine_args(config, False)  # files (CPU)
    for backend in ("ipc", "nccl"):
        args = vllm_engine_args(config, False, transfer=backend)
        assert args["weight_transfer_config"] == {"backend": backend}
        assert "weight_transfer" not in args  # our option, not vLLM's


def test_vllm_ipc_update_info_names_dtypes_shapes_and_checks_the_device():
    import torch

    from rl_rollout.backends.vllm_engine import ipc_update_info

    with pytest.raises(ValueError, match=r"'w' is on cpu; expected a tensor on the rollout's cuda"):
        ipc_update_info([("w", torch.zeros(2, 3))], "GPU-0", "cuda")


def test_vllm_engine_args_on_cpu_turn_chunked_prefill_off(tmp_path):
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 16384}')
    config = RolloutConfig(model_path=str(tmp_path), backend="vllm")
    args = vllm_engine_args(config, sleep_mode_available=False, cpu=True)
    assert args["enable_chunked_prefill"] is False
    assert args["max_num_batched_tokens"] == 16384  # the whole context fits one step
    config.max_model_len = 512
    assert vllm_engine_args(config, False, cpu=True)["max_num_batched_tokens"] == 8192
    config.engine_kwargs = {"enable_chunked_prefill": True}  # the user decides
    assert vllm_engine_args(config, False, cpu=True)["enable_chunked_prefill"] is True


def test_vllm_sampling_kwargs():
    params = SamplingParams(
        n=3, temperature=0.7, top_p=0.9, top_k=20, max_tokens=99, stop_token_ids=(2, 5), seed=11
    ).validate()
    kw = vllm_sampling_kwargs(params, max_tokens=40)
    assert kw == {
        "n": 3,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "max_tokens": 40,
        "stop_token_ids": [2, 5],
        "seed": 11,
        "logprobs": 0,
        "ignore_eos": True,
        "detokenize": False,
        "skip_special_tokens": False,
    }


class _Logprob:
    def __init__(self, logprob):
        self.logprob = logprob


def test_vllm_sampled_log_probs_picks_the_sampled_token():
    positions = [{4: _Logprob(-0.5)}, {9: _Logprob(-1.25), 3: _Logprob(-0.1)}]
    assert _sampled_log_probs([4, 9], positions) == [-0.5, -1.25]
    with pytest.raises(RuntimeError, match="1 log-prob entries for 2 tokens"):
        _sampled_log_probs([4, 9], positions[:1])
    with pytest.raises(RuntimeError, match="0 log-prob entries"):
        _sampled_log_probs([4], None)


@pytest.mark.skipif(HAS_VLLM, reason="checks the error shown when vLLM is missing")
def test_vllm_backend_without_vllm_names_the_extra():
    with pytest.raises((ImportError, PluginLoadError), match=r"rl-rollout\[vllm\]"):
        build_rollout_engine(RolloutConfig(model_path="/m", backend="vllm"))


# ---------------------------------------------------------------- SGLang
def test_sglang_engine_kwargs_from_rollout_config():
    config = RolloutConfig(
        model_path="/m",
        backend="sglang",
        tensor_parallel_size=4,
        max_model_len=2048,
        engine_kwargs={
            "enable_prefix_caching": False,
            "enforce_eager": False,
            "update_timeout_s": 5,
            "attention_backend": "fa3",
        },
    )
    kw = sglang_engine_kwargs(config)
    assert kw["model_path"] == "/m" and kw["skip_tokenizer_init"] is True
    assert kw["tp_size"] == 4 and kw["context_length"] == 2048
    assert kw["disable_radix_cache"] is True and kw["disable_cuda_graph"] is False
    assert kw["enable_memory_saver"] is True and kw["random_seed"] == 0
    assert kw["attention_backend"] == "fa3" and "update_timeout_s" not in kw
    default = sglang_engine_kwargs(RolloutConfig(model_path="/m"))
    assert "context_length" not in default and default["mem_fraction_static"] == 0.5
    assert default["disable_cuda_graph"] is False and default["disable_radix_cache"] is False


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("gpu_memory_utilization", 0.0, r"a number in \(0, 1\]"),
        ("gpu_memory_utilization", "0.5", "a finite number"),
        ("enforce_eager", "yes", "true or false"),
        ("enable_prefix_caching", 1, "true or false"),
        ("weight_bucket_bytes", 0, "bytes >= 1"),
        ("update_timeout_s", -1, "seconds > 0"),
        ("weight_transfer", "rdma", "one of"),
    ],
)
def test_server_options_name_the_key_the_value_and_the_expectation(key, value, expected):
    from rl_rollout.backends.options import SGLangOptions, VLLMOptions

    config = RolloutConfig(model_path="/m", engine_kwargs={key: value})
    pattern = rf"^engine_kwargs\.{key}: invalid value .*; expected .*{expected}"
    with pytest.raises(ValueError, match=pattern):
        vllm_engine_args(config, False)
    with pytest.raises(ValueError, match=pattern):
        sglang_engine_kwargs(config)
    assert VLLMOptions.from_kwargs({}).gpu_memory_utilization == 0.5
    # our own options never reach the libraries; theirs pass through untouched
    sglang = SGLangOptions.from_kwargs({"weight_transfer": "nccl", "attention_backend": "fa3"})
    assert sglang.weight_transfer == "nccl" and sglang.engine_args == {"attention_backend": "fa3"}
    with pytest.raises(
        ValueError, match=r"^engine_kwargs.weight_transfer: invalid value 'ipc'; expected one of"
    ):
        SGLangOptions.from_kwargs({"weight_transfer": "ipc"})


def test_sglang_sampling_params_per_sample():
    params = SamplingParams(n=2, temperature=0.0, top_k=-1, stop_token_ids=[7], seed=5)
    first = sglang_sampling_params(params.validate(), 0, max_tokens=12)
    second = sglang_sampling_params(params, 1, max_tokens=12)
    assert first == {
        "max_new_tokens": 12,
        "temperature": 0.0,
        "top_p": 1.0,
        "stop_token_ids": [7],
        "ignore_eos": True,
        "no_stop_trim": True,
        "skip_special_tokens": False,
        "n": 1,
        "sampling_seed": 5,
    }
    assert second["sampling_seed"] == 6
    assert "top_k" not in first  # -1 maps to SGLang's own "all tokens" default
    assert sglang_sampling_params(SamplingParams(top_k=3), 0, 4)["top_k"] == 3
    assert "sampling_seed" not in sglang_sampling_params(SamplingParams(), 0, 4)


def test_sglang_output_translation():
    result = {
        "output_ids": [11, 12, 2],
        "meta_info": {
            "finish_reason": {"type": "stop", "matched": 2},
            "output_token_logprobs": [(-0.1, 11, None), (-0.2, 12, None), (-0.3, 2, None)],
        },
    }
    out = sglang_output(result)
    assert out.token_ids == [11, 12, 2] and out.log_probs == [-0.1, -0.2, -0.3]
    assert out.finish_reason == "stop"
    result["meta_info"]["finish_reason"] = {"type": "abort", "message": "aborted"}
    assert sglang_output(result).finish_reason == "abort"
    result["meta_info"]["finish_reason"] = {"type": "length", "length": 3}
    assert sglang_output(result).finish_reason == "length"
    result["meta_info"]["output_token_logprobs"] = result["meta_info"]["output_token_logprobs"][:2]
    with pytest.raises(RuntimeError, match="2 log-prob entries for 3 tokens"):
        sglang_output(result)


@pytest.mark.skipif(HAS_SGLANG, reason="checks the error shown when SGLang is missing")
def test_sglang_backend_without_sglang_names_the_extra():
    with pytest.raises((ImportError, PluginLoadError), match=r"rl-rollout\[sglang\]"):
        build_rollout_engine(RolloutConfig(model_path="/m", backend="sglang"))


# ---------------------------------------------------------------- remote (OpenAI-compatible)
def test_remote_output_reads_token_ids_and_log_probs_of_a_completions_choice():
    from rl_rollout.manager_replicas import RolloutReplicaError, remote_output

    choice = {
        "index": 0,
        "finish_reason": "stop",
        "logprobs": {"tokens": ["token_id:17", "token_id:2"], "token_logprobs": [-0.5, -1.25]},
    }
    out = remote_output(choice)
    assert out.token_ids == [17, 2] and out.log_probs == [-0.5, -1.25]
    assert out.finish_reason == "stop" and out.weight_versions is None
    cut = remote_output({**choice, "finish_reason": "abort"})
    assert cut.finish_reason == "abort"
    with pytest.raises(RolloutReplicaError, match="expected 'token_id:<id>'"):
        remote_output({**choice, "logprobs": {"tokens": ["hi"], "token_logprobs": [-1.0]}})


class _SGLangRequests:
    """SGLang's request types as the engine builds them (SGLang needs CUDA to run; the
    types' fields are checked against the pinned wheel by test_api_surface.py)."""

    class ReleaseMemoryOccupationReqInput:
        def __init__(self, *, tags):
            self.tags = tags

    class ResumeMemoryOccupationReqInput(ReleaseMemoryOccupationReqInput):
        pass


class _RecordingTokenizerManager:
    def __init__(self):
        self.calls = []

    async def release_memory_occupation(self, request, http_request):
        self.calls.append(("release", request.tags))

    async def resume_memory_occupation(self, request, http_request):
        self.calls.append(("resume", request.tags))

    def abort_request(self, rid):
        self.calls.append(("abort", rid))


def _sglang_engine_shell():
    """The backend's sleep/wake-up state around a recording tokenizer manager."""
    from rl_rollout.backends.sglang_engine import SGLangRolloutEngine

    engine = SGLangRolloutEngine.__new__(SGLangRolloutEngine)
    engine._tm, engine._io = _RecordingTokenizerManager(), _SGLangRequests
    engine._in_flight, engine._released = {"r": ["r-0", "r-1"]}, ()
    return engine


def test_sglang_sleep_levels_release_kv_cache_then_weights_and_wake_up_resumes_them():
    """Level 1 releases the KV cache only, level 2 also weights and CUDA graphs; wake_up
    resumes exactly what was released (SGLang refuses to resume a tag it did not release),
    a repeated sleep releases only what is still held, requests in flight are aborted."""
    import asyncio

    engine = _sglang_engine_shell()
    asyncio.run(engine.sleep(1))
    assert engine._tm.calls == [("abort", "r-0"), ("abort", "r-1"), ("release", ["kv_cache"])]
    engine._tm.calls.clear()
    engine._in_flight = {}
    asyncio.run(engine.sleep(2))  # deeper: the rest
    asyncio.run(engine.wake_up())
    asyncio.run(engine.wake_up())  # awake: nothing to resume
    assert engine._tm.calls == [
        ("release", ["weights", "cuda_graph"]),
        ("resume", ["kv_cache", "weights", "cuda_graph"]),
    ]
    engine._tm.calls.clear()
    asyncio.run(engine.sleep(2))
    asyncio.run(engine.sleep(1))  # already released
    assert engine._tm.calls == [("release", ["kv_cache", "weights", "cuda_graph"])]
    with pytest.raises(ValueError, match="sleep level=3 is invalid: expected 1 or 2"):
        asyncio.run(engine.sleep(3))

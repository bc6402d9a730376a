"""The rollout-engine contract: async, token-in/token-out generation.

A rollout engine (vLLM, SGLang, the Hugging Face reference, a third-party engine) takes
prompt token ids and per-request sampling parameters and returns, for each of the `n`
samples, the generated token ids, the log-prob of every sampled token and why generation
finished. Engines never see text: tokenisation and chat templates belong to the agent loop,
so token streams stay exact across turns.

Semantics every implementation honours (checked by ``rl_core.testing.rollout_engine``):

* Generation stops only at one of ``stop_token_ids`` (the stop token is the last element of
  ``token_ids``, finish reason ``"stop"``), after ``max_tokens`` tokens or at the context
  length (``"length"``), or when the request is aborted (``"abort"``, with the tokens
  generated so far). The model's own EOS is *not* implied: callers pass the ids to stop at.
* ``log_probs[i]`` is the log-prob of ``token_ids[i]`` under the distribution it was
  sampled from: ``logits / temperature``, restricted to the top-k / top-p set and
  renormalised (vLLM's ``processed_logprobs``). With top_p=1 and top_k=-1 (the RL default)
  this is ``log_softmax(logits / temperature)``, what a trainer recomputes; with
  temperature 0 (greedy) it is ``log_softmax(logits)``.
* The same ``seed`` with the same prompt and weights gives the same outputs; the ``n``
  samples of one request differ from each other.
* Bad input raises ``ValueError`` naming the field, the value and what was expected.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from torch import Tensor

from rl_core.config import build, check
from rl_core.config import validate as _validate
from rl_core.registry import Registry

__all__ = [
    "ROLLOUTS",
    "ROUTED_EXPERTS",
    "FinishReason",
    "GenerationOutput",
    "RolloutConfig",
    "RolloutEngine",
    "SamplingParams",
    "build_rollout_engine",
    "check_prompt",
    "check_stop_token_ids",
    "logprob_temperature",
]

ROUTED_EXPERTS = "routed_experts"
"""The batch field of the experts a mixture-of-experts rollout routed each token to (router
replay, R3): int16 [B, P + R, num_moe_layers, top_k] on CPU, aligned with ``input_ids``
(left-padded prompt, right-padded response); entry ``[b, t, l]`` holds the expert ids that
MoE layer l (in model order) selected for token t of row b, -1 where nothing was recorded
(padding, and the last response token, which no rollout forward pass reads). Produced when
`RolloutConfig.return_routed_experts` is set; replayed by engines whose
`rl_core.engine.EngineConfig.router_replay` is set."""

FinishReason = Literal["stop", "length", "abort"]
FINISH_REASONS = ("stop", "length", "abort")
_MAX_SEED = 2**63 - 1

ROLLOUTS: Registry[type[RolloutEngine]] = Registry("rl.rollouts", kind="rollout engine")
"""Rollout engines by name: ``hf``, ``vllm``, ``sglang`` from rl-rollout, or your own."""


@dataclass
class SamplingParams:
    """Per-request sampling parameters (vLLM's meanings).

    temperature 0 means greedy; top_k -1 disables top-k; top_p 1.0 disables top-p;
    ``seed`` makes the request reproducible (None: engine-chosen randomness).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256
    stop_token_ids: Sequence[int] = ()
    seed: int | None = None

    def check(self) -> None:
        check(self.n >= 1, "n", self.n, "an integer >= 1")
        check(self.temperature >= 0, "temperature", self.temperature,
              "a finite number >= 0 (0 means greedy)")  # fmt: skip
        check(0 < self.top_p <= 1, "top_p", self.top_p, "a number in (0, 1]")
        check(self.top_k == -1 or self.top_k >= 1, "top_k", self.top_k,
              "-1 (disabled) or an integer >= 1")  # fmt: skip
        check(self.max_tokens >= 1, "max_tokens", self.max_tokens, "an integer >= 1")
        check(all(t >= 0 for t in self.stop_token_ids), "stop_token_ids", self.stop_token_ids,
              "a sequence of token ids (integers >= 0)")  # fmt: skip
        check(self.seed is None or 0 <= self.seed <= _MAX_SEED, "seed", self.seed,
              f"null or an integer in [0, {_MAX_SEED}]")  # fmt: skip

    def validate(self) -> SamplingParams:
        """Raise `ConfigError` naming the field, its value and the allowed range; return
        self (``stop_token_ids`` as a tuple)."""
        return _validate(self, "SamplingParams")


@dataclass
class GenerationOutput:
    """One sample: generated token ids, the log-prob of each, and why generation ended.

    ``weight_versions`` (optional): the policy version of the weights each token was sampled
    with (the ``version`` of the latest `RolloutEngine.update_weights`); a request that
    spans a weight update has tokens of two versions (a partial rollout). None: the
    engine does not record versions.

    ``routed_experts`` (only with `RolloutConfig.return_routed_experts`, MoE models): the
    experts each MoE layer selected for every token of ``prompt_ids + token_ids`` that a
    forward pass read, i.e. all but the last generated token: an int16 CPU tensor
    [len(prompt_ids) + len(token_ids) - 1, num_moe_layers, top_k] (fewer rows for a request
    aborted before its prefill). None: not recorded."""

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: FinishReason
    weight_versions: list[int] | None = None
    routed_experts: Tensor | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.log_probs):
            raise ValueError(
                f"GenerationOutput: {len(self.token_ids)} token_ids but "
                f"{len(self.log_probs)} log_probs; expected one log-prob per token"
            )
        if self.weight_versions is not None and len(self.weight_versions) != len(self.token_ids):
            raise ValueError(
                f"GenerationOutput: {len(self.token_ids)} token_ids but "
                f"{len(self.weight_versions)} weight_versions; expected one per token or None"
            )
        if self.routed_experts is not None and self.routed_experts.dim() != 3:
            raise ValueError(
                f"GenerationOutput.routed_experts has shape {tuple(self.routed_experts.shape)}: "
                "expected [tokens, num_moe_layers, top_k]"
            )
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(
                f"GenerationOutput.finish_reason={self.finish_reason!r} is invalid: "
                f"expected one of {FINISH_REASONS}"
            )


@dataclass
class RolloutConfig:
    """How to start a rollout engine. Backend-specific options go in ``engine_kwargs``,
    which the backend validates into its own typed options (e.g. vLLM's and SGLang's
    ``gpu_memory_utilization``, ``enforce_eager``, ``enable_prefix_caching``; the Hugging
    Face backend's ``batch_wait_ms``).

    ``dtype`` is a torch dtype name ("float32", "bfloat16", "float16"); CPU runs use
    float32. ``max_model_len`` None means the model's own context length.
    ``max_num_seqs``: the most sequences an engine runs at once.
    ``return_routed_experts``: record the experts a mixture-of-experts model routes every
    token to (`GenerationOutput.routed_experts`, for router replay); a backend that cannot
    refuses it when built, and a dense model is refused.
    """

    model_path: str
    backend: str = "hf"
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    seed: int = 0
    max_num_seqs: int = 256
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    return_routed_experts: bool = False

    def check(self) -> None:
        check(bool(self.model_path), "model_path", self.model_path,
              "a non-empty path to a Hugging Face model directory")  # fmt: skip
        check(bool(self.backend), "backend", self.backend,
              f"a rollout engine name, one of {ROLLOUTS.names()}")  # fmt: skip
        check(self.tensor_parallel_size >= 1, "tensor_parallel_size", self.tensor_parallel_size,
              "an integer >= 1")  # fmt: skip
        check(self.max_model_len is None or self.max_model_len >= 2, "max_model_len",
              self.max_model_len, "null or an integer >= 2")  # fmt: skip
        check(0 <= self.seed <= _MAX_SEED, "seed", self.seed, f"an integer in [0, {_MAX_SEED}]")
        check(self.max_num_seqs >= 1, "max_num_seqs", self.max_num_seqs, "an integer >= 1")

    def validate(self) -> RolloutConfig:
        """Raise `ConfigError` naming the field, its value and what was expected; return self."""
        return _validate(self, "RolloutConfig")


def logprob_temperature(temperature: float) -> float:
    """The temperature at which a trainer recomputes the log-probs of tokens sampled at
    ``temperature``: the same, except greedy sampling (0), whose tokens' log-probs are
    ``log_softmax(logits)`` (temperature 1), as the contract above defines."""
    check(temperature >= 0, "temperature", temperature, "a finite number >= 0 (0: greedy)")
    return float(temperature) if temperature > 0 else 1.0


def check_prompt(prompt_ids: Sequence[int], max_model_len: int, vocab_size: int) -> list[int]:
    """Validate prompt token ids for an engine; return them as a list of ints.

    Raises ValueError for an empty prompt, ids outside ``[0, vocab_size)`` or a prompt that
    leaves no room for one generated token within ``max_model_len``.
    """
    if isinstance(prompt_ids, (str, bytes)):
        raise ValueError(
            f"prompt_ids is a {type(prompt_ids).__name__}: expected a list of token ids "
            "(engines are token-in/token-out; tokenise in the agent loop)"
        )
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise ValueError("prompt_ids is empty: expected at least one token id")
    lo, hi = min(ids), max(ids)
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(
            f"prompt_ids contains token id {bad}: expected ids in [0, {vocab_size}) "
            "(the model's vocabulary size)"
        )
    if len(ids) >= max_model_len:
        raise ValueError(
            f"prompt_ids has {len(ids)} tokens: expected fewer than max_model_len="
            f"{max_model_len} so at least one token can be generated"
        )
    return ids


def check_stop_token_ids(stop_token_ids: Sequence[int], vocab_size: int) -> None:
    """Raise ValueError when a stop token id lies outside ``[0, vocab_size)``."""
    bad = [t for t in stop_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(
            f"SamplingParams.stop_token_ids contains {bad[0]}: expected ids in "
            f"[0, {vocab_size}) (the model's vocabulary size)"
        )


class RolloutEngine(ABC):
    """Async token-in/token-out generation engine (one replica, possibly tensor-parallel).

    Construct through `build_rollout_engine` (or the class with a `RolloutConfig`); the
    constructor loads the model and starts the engine. All methods are coroutines and are
    safe to call concurrently from one event loop.
    """

    #: The dataclass of this backend's own options (``RolloutConfig.engine_kwargs``),
    #: built by `parse_options`; None: the backend reads them itself (not checked ahead).
    options_class: ClassVar[type | None] = None

    #: Whether this backend honours `RolloutConfig.return_routed_experts` (router replay);
    #: a trainer refuses the option for a backend that does not.
    supports_routed_experts: ClassVar[bool] = False

    @classmethod
    def parse_options(cls, config: RolloutConfig) -> Any:
        """This backend's typed options from ``config.engine_kwargs`` (errors name
        ``engine_kwargs.<key>``); a trainer calls it before any worker starts, the engine in
        ``__init__``. Backends that pass unknown keys on to a library override it."""
        if cls.options_class is None:  # the backend reads engine_kwargs itself
            return dict(config.engine_kwargs)
        return build(cls.options_class, config.engine_kwargs, "engine_kwargs")

    @property
    @abstractmethod
    def max_model_len(self) -> int:
        """Context length: prompt plus generated tokens never exceed it."""

    @abstractmethod
    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: SamplingParams,
        request_id: str,
        multi_modal_data: dict[str, Any] | None = None,
    ) -> list[GenerationOutput]:
        """Generate ``sampling_params.n`` samples for one prompt.

        ``request_id`` must be unique among in-flight requests; `abort` uses it. An aborted
        request returns (does not raise) with finish reason ``"abort"``.

        ``multi_modal_data`` (vision-language models): ``{"image": [PIL images]}``; the
        prompt then holds one image placeholder token per vision token (the
        processor-expanded ids a trainer uses; engines that expand placeholders themselves
        collapse them first). A vision model never samples its placeholder tokens.
        Checked by ``rl_core.testing.rollout_engine_images``.
        """

    @abstractmethod
    async def abort(self, request_ids: list[str]) -> None:
        """Abort in-flight requests (unknown or finished ids are ignored)."""

    @abstractmethod
    async def update_weights(
        self, weights: Iterable[tuple[str, Tensor]], version: int | None = None
    ) -> None:
        """Load weights in place, by Hugging Face parameter name (a subset is allowed).

        One call is one update session however many tensors it brings (fused layers are
        rebuilt once all their tensors arrived). ``weights`` may block between tensors
        while the trainer produces them. ``version`` (the trainer's policy version) is
        recorded on the tokens sampled after the update (`GenerationOutput.weight_versions`);
        requests in flight continue with the new weights (partial rollouts) or are aborted,
        as the engine documents."""

    @abstractmethod
    async def sleep(self, level: int = 1) -> None:
        """Free memory while idle: level 1 offloads weights and drops the KV cache; level 2
        may also discard weights (then the next `update_weights` must bring all of them).
        In-flight requests are aborted (they return with finish reason ``"abort"``).
        Engines that cannot free memory on this platform accept the call and free nothing."""

    @abstractmethod
    async def wake_up(self) -> None:
        """Restore what `sleep` released; generation works again afterwards."""

    @abstractmethod
    async def reset_prefix_cache(self) -> None:
        """Drop cached prefixes (call after a weight update)."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Stop the engine and release its resources; idempotent."""


def build_rollout_engine(config: RolloutConfig) -> RolloutEngine:
    """Validate `config` and build the engine registered as ``config.backend``.

    Unknown names raise `UnknownPluginError` (listing installed engines); a backend whose
    extra is missing raises `PluginLoadError` naming the extra to install.
    """
    if not isinstance(config, RolloutConfig):
        raise TypeError(
            f"build_rollout_engine expects a RolloutConfig, got {type(config).__name__}"
        )
    config.validate()
    engine = ROLLOUTS.build(config.backend, config)
    if not isinstance(engine, RolloutEngine):
        raise TypeError(
            f"rollout engine {config.backend!r} built a {type(engine).__name__}, "
            "which is not a rl_core.rollout.RolloutEngine"
        )
    return engine

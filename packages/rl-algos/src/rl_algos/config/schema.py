"""The trainer's config: typed dataclasses, one per YAML section; each `__post_init__`
raises `ConfigError` naming the field. Optimizer and parallelism are rl-core's engine configs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from rl_algos.config.curriculum_section import CurriculumConfig
from rl_algos.config.distill_section import DistillConfig
from rl_algos.config.env_section import EnvConfig
from rl_algos.config.judge_section import JudgeConfig
from rl_algos.config.vla_section import VLAConfig
from rl_algos.kl import KL_TYPES
from rl_algos.losses import PolicyLossConfig, ValueLossConfig
from rl_core.config import check
from rl_core.engine.config import LoRAConfig, OptimizerConfig, ParallelConfig

__all__ = [
    "LOGGERS",
    "ActorConfig",
    "AlgorithmConfig",
    "AsyncConfig",
    "CriticConfig",
    "DataConfig",
    "DynamicSamplingConfig",
    "KLControlConfig",
    "OverlongConfig",
    "PolicyModelConfig",
    "RLConfig",
    "RewardConfig",
    "RolloutSectionConfig",
    "TrainerConfig",
]

# Metric sinks the trainer knows (rl_algos.trainer.tracking).
LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")


def _positive(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        check(value is not None and value >= 1, name, value, "an integer >= 1")


def _optional_positive(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        check(value is None or value >= 1, name, value, "null or an integer >= 1")


@dataclass
class PolicyModelConfig:
    """The policy model (actor, reference and rollout share it).

    path: a Hugging Face model directory, ``gguf:<file.gguf>`` / ``gguf:<package>``, or
    the alias ``smollm2-135m-instruct`` (see rl_algos.trainer.model_source).
    dtype: the master weights and optimizer state of trained models (keep float32);
    compute_dtype: forward/backward ("auto": bfloat16 on accelerators, float32 on CPU;
    the rollout's own dtype is `rollout.dtype`); attn_implementation: the Hugging Face
    attention kernel ("auto": the platform's preferred one, e.g. flash_attention_2 where
    flash-attn is installed); use_remove_padding: padding-free packing (null: when the
    attention kernel is a varlen one); both are options of the fsdp engine: when set
    (not "auto"/null) they go into every role's `engine_kwargs` (a role's own
    `engine_kwargs` wins); freeze_vision_tower: a vision-language model's
    vision encoder is not trained.
    lora: train low-rank adapters instead of all weights (rank, alpha, target_modules,
    dropout); the reference policy is then the same model with its adapters disabled.
    ship_to_workers: send the model's files to the workers (for nodes that cannot see the
    driver's path and have no copy in their Hugging Face cache; up to 2 GiB). Without it a
    worker that cannot see the path resolves ``path`` itself (e.g. a hub id in its cache)."""

    path: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    compute_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    attn_implementation: str = "auto"
    use_remove_padding: bool | None = None
    freeze_vision_tower: bool = False
    lora: LoRAConfig | None = None
    ship_to_workers: bool = False

    def __post_init__(self) -> None:
        if self.lora is not None:
            self.lora.validate()


@dataclass
class DataGenerateConfig:
    """A built-in generated task written as files at trainer start (no download).

    task: `arithmetic` or `countdown` (null: use `train_files`/`val_files` as given);
    options: the task's fields (rl_algos.data.tasks), e.g. ``{max_value: 20}``. The files
    go to ``<trainer.output_dir>/data`` and become `train_files` and `val_files`.
    plain_test_size > 0 also writes a plain split (``plain_test``, disjoint from the others):
    the same task with `PLAIN_SPLIT_OPTIONS` (no system prompt, no demos, held-out
    phrasings) and then `plain_options` applied; it becomes ``data.extra_val_files.plain``
    and is reported as ``val/plain_accuracy`` etc. (arithmetic only). train_repeats: training
    problems may recur, following the task's distribution (`make_splits`)."""

    task: str | None = None
    train_size: int = 1000
    test_size: int = 100
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    plain_test_size: int = 0
    plain_options: dict[str, Any] = field(default_factory=dict)
    train_repeats: bool = False

    def __post_init__(self) -> None:
        _positive(self, "train_size", "test_size")
        check(self.plain_test_size >= 0, "plain_test_size", self.plain_test_size, ">= 0")
        check(
            self.plain_test_size == 0 or self.task in (None, "arithmetic"),
            "plain_test_size",
            self.plain_test_size,
            "0 unless data.generate.task is 'arithmetic' (the plain split asks arithmetic "
            "in held-out words)",
        )


PLAIN_SPLIT_OPTIONS: dict[str, Any] = {
    "phrasings": "held_out",
    "few_shot": 0,
    "few_shot_min": None,
    "system_prompt": None,
    "instruction_example": False,
    "instruction_share": 0.5,
}
"""The arithmetic options a plain validation split overrides: what a user asks in chat."""


@dataclass
class DataConfig:
    """Prompts: verl-style parquet/jsonl files (see rl_algos.data).

    train_batch_size: prompts per step (each sampled `rollout.n` times).
    dataset: the prompt dataset by name (``rl.datasets``): ``prompt``, or ``vlm`` (rows with
    images, from rl-multimodal).
    max_prompt_length: a longer prompt is refused, naming its file and row;
    filter_overlong_prompts: drop such prompts instead (warned of, counted in
    ``data/<split>_filtered_overlong``); max_response_length: generation budget.
    extra_val_files: named validation sets besides `val_files` (name -> files); each is
    validated with it and reported as ``val/<name>_<metric>`` (e.g. ``val/plain_accuracy``).
    curriculum: draw training prompts by kind after what the policy can learn
    (rl_algos.config.curriculum_section)."""

    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)
    extra_val_files: dict[str, list[str]] = field(default_factory=dict)
    prompt_key: str = "prompt"
    max_prompt_length: int = 512
    max_response_length: int = 256
    train_batch_size: int = 8
    shuffle: bool = True
    seed: int = 0
    apply_chat_template: bool = True
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    filter_overlong_prompts: bool = False
    dataset: str = "prompt"
    generate: DataGenerateConfig = field(default_factory=DataGenerateConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)

    def __post_init__(self) -> None:
        _positive(self, "max_prompt_length", "max_response_length", "train_batch_size")
        for name, files in self.extra_val_files.items():
            check(
                isinstance(name, str) and name.isidentifier() and "/" not in name,
                "extra_val_files",
                name,
                "names that are identifiers (letters, digits, _), e.g. plain",
            )
            check(
                isinstance(files, list) and bool(files),
                f"extra_val_files.{name}",
                files,
                "a non-empty list of files",
            )


@dataclass
class ActorConfig:
    """The policy's training: engine, optimizer, parallelism, micro-batching, PPO loop
    (`mini_batch_size` prompts per optimizer step, `epochs` passes per batch) and loss.
    `engine_kwargs`: the engine's own options (e.g. the megatron engine's
    ``sequence_parallel``, ``virtual_pipeline_size``, ``moe_token_dispatcher``)."""

    engine: str = "fsdp"
    optim: OptimizerConfig = field(default_factory=OptimizerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    micro_batch_size: int | None = None
    max_tokens_per_micro_batch: int | None = None
    on_nan: Literal["raise", "skip"] = "raise"
    mini_batch_size: int = 8
    epochs: int = 1
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    offload_when_generating: bool = False
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """The engine's own options (e.g. fsdp: ``logprob_chunk_tokens``)."""
    recompute_old_log_probs: bool | None = None
    """Run a separate no-grad pass for the old log-probs. null (auto): only when it can
    change the result (several mini-batches or epochs, a KL penalty in the reward);
    otherwise the update's own forward pass provides them (detached), as on-policy
    trainers do. true: always (e.g. for the rollout-vs-trainer mismatch metrics)."""
    router_replay: bool = False
    """Router replay (R3), mixture-of-experts models only: the rollout records the experts
    each token was routed to (batch field ``routed_experts``) and every forward pass of the
    actor and the reference model routes the tokens to those experts (fsdp and megatron
    engines), so that rollout and trainer compute the same experts. Needs a rollout backend
    that records routing (hf, vllm, sglang) and a colocated or split placement."""

    def __post_init__(self) -> None:
        _positive(self, "mini_batch_size", "epochs")
        _optional_positive(self, "micro_batch_size", "max_tokens_per_micro_batch")


@dataclass
class CriticConfig:
    """PPO's value model (used when `algorithm.adv_estimator` is `gae`); `model_path`
    null: the policy model with a value head. placement: `colocated` (the critic shares
    the actor's worker processes) or `split` (`num_workers` processes of its own)."""

    engine: str = "fsdp"
    placement: Literal["colocated", "split"] = "colocated"
    num_workers: int = 1
    model_path: str | None = None
    optim: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=1e-5))
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    micro_batch_size: int | None = None
    max_tokens_per_micro_batch: int | None = None
    on_nan: Literal["raise", "skip"] = "raise"
    epochs: int = 1
    loss: ValueLossConfig = field(default_factory=ValueLossConfig)
    engine_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _positive(self, "epochs", "num_workers")
        _optional_positive(self, "micro_batch_size", "max_tokens_per_micro_batch")


@dataclass
class RolloutSectionConfig:
    """Generation: the rollout engine (`backend`, from the `rl.rollouts` entry points),
    the sequence generator and agent loop, sampling, and the tool-loop settings.

    `tools` (name -> constructor kwargs, from the `rl.tools` entry points): their schemas
    go into the prompts' chat template (``tools=``); `tool_parser` reads the model's calls,
    each runs for at most `tool_timeout_s`; `chat_template_kwargs` are passed when the loop
    templates later turns. Empty `stop_token_ids`: every EOS id of the tokenizer and of the
    model's generation config.

    placement: `colocated` (the hybrid engine: one rollout engine inside every training
    worker, weights synced in process), `split` (a rollout pool of its own:
    `num_replicas` Ray actors with `cpus_per_replica` CPUs and `gpus_per_replica` devices
    each, engines of `tensor_parallel_size`; weights pushed from the trainer's rank 0) or
    `remote` (existing OpenAI-compatible servers at `remote_urls` serving `remote_model`,
    for evaluation and agents: their weights never follow the policy)."""

    backend: str = "hf"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Generation dtype ("auto": bfloat16 on accelerators, float32 on CPU)."""
    generator: str = "agent_loop"
    agent_loop: str = "single_turn"
    sleep_while_training: bool | None = None
    """Colocated hybrid engine: the rollout sleeps (frees its KV cache and device weights)
    after generating and wakes at the next weight sync (null: on accelerators only)."""
    n: int = 4
    temperature: float = 1.0
    """Sampling temperature of training rollouts. 0: greedy, and the trainer recomputes
    log-probs at temperature 1 (rl-core's temperature-0 rule); refused with a group
    estimator (its n samples would be identical)."""
    top_p: float = 1.0
    top_k: int = -1
    val_temperature: float = 0.0
    val_n: int = 1
    stop_token_ids: list[int] = field(default_factory=list)
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    """vLLM/SGLang: the accelerator memory fraction; set, it goes into `engine_kwargs`
    (null: the backend's default, 0.5)."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    max_turns: int = 5
    max_parallel_calls: int = 1
    max_tool_response_tokens: int = 256
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    tool_parser: str = "hermes"
    tool_timeout_s: float = 60.0
    tool_response_truncation: Literal["left", "right", "middle"] = "middle"
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    placement: Literal["colocated", "split", "remote"] = "colocated"
    num_replicas: int = 1
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    remote_urls: list[str] = field(default_factory=list)
    remote_model: str | None = None
    on_replica_loss: Literal["replace", "drop", "fail"] = "replace"
    """Split/remote placement: a rollout replica that dies is `replace`d (a new actor,
    serving after the next weight sync; a remote server, not ours, is dropped), `drop`ped
    (the pool shrinks) or ends the run (`fail`); its in-flight requests go again. Colocated:
    the rollout lives in a training worker, whose loss the trainer's failover handles."""

    guide_prompt_key: str | None = None
    """Guided samples: `guided_n` of each prompt's `n` samples are generated after the
    row's prompt column `guide_prompt_key` instead (e.g. the arithmetic task's
    ``teacher_prompt``: the same problem after worked demos), then trained, like the
    others, as responses to the row's own prompt. Their group's advantages compare them
    with the model's own answers, so what the guide's context makes the model say (a
    format, a method) is pushed into the bare prompt: context distillation by sampling,
    with no teacher model. The update treats them as on-policy (their old log-probs are
    recomputed after the own prompt; no importance weight for the other context): a
    biased gradient, by design. null: off."""
    guided_n: int = 0
    """How many of each prompt's `n` samples are guided (1..n with `guide_prompt_key`)."""
    guided_temperature: float | None = None
    """The guided samples' sampling temperature (0: greedy); null: `temperature`, like the
    model's own samples. The update's log-probs stay at `temperature` for every sample."""
    reference_key: str | None = None
    """Reference samples: `reference_n` of each prompt's `n` samples are not generated but
    the row's reference answer, the text in column `reference_key` (e.g. the arithmetic
    task's ``worked_answer``) tokenized and ended with EOS (at most
    `data.max_response_length` tokens, else the data is refused). They are scored by the
    reward like the others and trained as responses to the row's own prompt, so GRPO weighs
    the demonstration against the model's own answers within the group (off-policy
    guidance, as in LUFFY: imitated where the model fails, ignored where it already
    succeeds). Marked ``guided`` for the metrics and the curriculum. null: off."""
    reference_n: int = 0
    """How many of each prompt's `n` samples are the reference (the group's first; 1..n-1
    with `reference_key`, with `guided_n` at most n-1 together)."""

    def __post_init__(self) -> None:
        _positive(self, "n", "val_n", "tensor_parallel_size", "max_turns", "max_parallel_calls")
        _positive(self, "num_replicas")
        check(
            self.placement != "colocated" or self.tensor_parallel_size == 1,
            "tensor_parallel_size",
            self.tensor_parallel_size,
            "1 with placement colocated (each training process hosts a one-device engine); "
            "use placement split with gpus_per_replica >= tensor_parallel_size",
        )
        check(
            self.guide_prompt_key is None or 1 <= self.guided_n <= self.n,
            "guided_n",
            self.guided_n,
            f"in 1..rollout.n ({self.n}) with guide_prompt_key {self.guide_prompt_key!r}",
        )
        check(
            self.guide_prompt_key is not None or self.guided_n == 0,
            "guided_n",
            self.guided_n,
            "0 without rollout.guide_prompt_key (which prompt column guides the samples?)",
        )
        check(
            self.reference_key is None or 1 <= self.reference_n <= self.n - 1 - self.guided_n,
            "reference_n",
            self.reference_n,
            f"in 1..rollout.n - 1 - guided_n ({self.n - 1 - self.guided_n}) with "
            f"reference_key {self.reference_key!r}: each group keeps one of the model's "
            "own samples at least",
        )
        check(
            self.reference_key is not None or self.reference_n == 0,
            "reference_n",
            self.reference_n,
            "0 without rollout.reference_key (which column holds the reference answer?)",
        )
        check(
            self.guided_temperature is None
            or (self.guide_prompt_key is not None and 0 <= self.guided_temperature < math.inf),
            "guided_temperature",
            self.guided_temperature,
            "null without guide_prompt_key, else a finite number >= 0 (0: greedy)",
        )
        check(self.cpus_per_replica > 0, "cpus_per_replica", self.cpus_per_replica, "> 0")
        check(self.gpus_per_replica >= 0, "gpus_per_replica", self.gpus_per_replica, ">= 0")
        check(
            self.placement != "remote" or bool(self.remote_urls),
            "remote_urls",
            self.remote_urls,
            "a non-empty list of server URLs with placement 'remote'",
        )
        check(
            self.val_n == 1 or self.val_temperature > 0,
            "val_n",
            self.val_n,
            "1 when val_temperature is 0 (greedy decoding repeats one sample; set "
            "rollout.val_temperature > 0 for pass@k / maj@k)",
        )
        _positive(self, "max_tool_response_tokens")
        check(self.tool_timeout_s > 0, "tool_timeout_s", self.tool_timeout_s, "> 0 seconds")
        for name in ("temperature", "val_temperature"):
            value = getattr(self, name)
            check(value >= 0, name, value, ">= 0 (0: greedy)")
        check(0 < self.top_p <= 1, "top_p", self.top_p, "in (0, 1]")
        check(self.top_k == -1 or self.top_k >= 1, "top_k", self.top_k, "-1 (off) or >= 1")
        check(
            self.gpu_memory_utilization is None or 0 < self.gpu_memory_utilization <= 1,
            "gpu_memory_utilization",
            self.gpu_memory_utilization,
            "null (the backend's default) or in (0, 1]",
        )


@dataclass
class RewardConfig:
    """Rule-based rewards. `function_path` null: each sample's function is chosen by its
    `data_source` (rl_algos.rewards); else `function_name` from that Python file, with
    verl's signature. Each call runs in one of `num_workers` processes for at most
    `timeout_s` seconds, and a whole batch for at most `batch_timeout_s`; a failing or
    timed-out call scores `error_score`. When more than `max_failure_fraction` of a
    batch's calls fail, the run stops with `RewardFailureError`.

    A score outside [`min_score`, `max_score`] or not finite is counted
    (`reward/out_of_range`, `reward/nonfinite`) and handled by `invalid_score_policy`:
    `clip` (to the bounds; NaN scores `error_score`), `error_score`, or `raise`."""

    function_path: str | None = None
    function_name: str = "compute_score"
    num_workers: int = 4
    timeout_s: float = 30.0
    batch_timeout_s: float = 600.0
    error_score: float = 0.0
    max_failure_fraction: float = 0.5
    min_score: float = -1e4
    max_score: float = 1e4
    invalid_score_policy: Literal["clip", "error_score", "raise"] = "clip"
    memory_limit_mb: int | None = 4096
    """Most memory (MiB) a reward worker process may hold (a function that eats more gets
    a `MemoryError`, scored as an error); null: no cap."""
    model_path: str | None = None
    """A reward model (scalar head, RLHF-style) run by `model_engine` on the actor's
    workers: its score of each response is added to the rule-based score, times
    `model_weight` (null: no reward model). Its tokenizer must be the policy's."""
    model_engine: str = "fsdp"
    model_weight: float = 1.0
    rule_based: bool = True
    """False: no rule-based functions run; the reward model, the judge or a distillation
    teacher alone give the signal."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """A generative reward model (an LLM judge; rl_algos.config.judge_section): its score
    times `judge.weight` is added (null `judge.model_path`: no judge)."""

    def __post_init__(self) -> None:
        check(self.num_workers >= 0, "num_workers", self.num_workers, ">= 0 (0: in-process)")
        check(self.timeout_s > 0, "timeout_s", self.timeout_s, "> 0 seconds")
        check(
            self.memory_limit_mb is None or self.memory_limit_mb >= 64,
            "memory_limit_mb",
            self.memory_limit_mb,
            ">= 64 (MiB) or null (no cap)",
        )
        check(
            self.batch_timeout_s >= self.timeout_s,
            "batch_timeout_s",
            self.batch_timeout_s,
            f">= reward.timeout_s={self.timeout_s} seconds",
        )
        for name in ("min_score", "max_score"):
            value = getattr(self, name)
            check(abs(value) <= 1e30, name, value, "a finite number, |x| <= 1e30")
        check(
            self.min_score < self.max_score,
            "max_score",
            self.max_score,
            f"> reward.min_score={self.min_score}",
        )
        check(
            self.min_score <= self.error_score <= self.max_score,
            "error_score",
            self.error_score,
            f"a finite number in [reward.min_score, reward.max_score] = "
            f"[{self.min_score}, {self.max_score}]",
        )
        check(
            0 <= self.max_failure_fraction <= 1,
            "max_failure_fraction",
            self.max_failure_fraction,
            "in [0, 1] (the share of a batch's reward calls that may fail)",
        )


@dataclass
class KLControlConfig:
    """Coefficient of the KL-in-reward penalty: `fixed` at `kl_coef`, or `adaptive`
    (moves it so the KL approaches `target_kl`, at a rate set by `horizon`)."""

    type: Literal["fixed", "adaptive"] = "fixed"
    kl_coef: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000

    def __post_init__(self) -> None:
        check(self.kl_coef >= 0, "kl_coef", self.kl_coef, ">= 0")
        check(self.target_kl > 0, "target_kl", self.target_kl, "> 0")
        _positive(self, "horizon")


@dataclass
class DynamicSamplingConfig:
    """DAPO's dynamic sampling: keep generating until `data.train_batch_size` groups whose
    `metric` (seq_score, seq_reward or a reward extra such as acc) varies are collected;
    at most `max_rounds` generation rounds per step (0: no cap), then fail or, with
    `accept_partial`, train on fewer groups. With ``data.curriculum`` (score
    ``informative``) the prompts of each round are drawn by kind after the chance that
    their group is kept here; both together: the curriculum lowers the share of dropped
    groups (``dapo/kept_fraction`` up, ``dapo/gen_rounds`` down), dynamic sampling drops
    those it could not avoid."""

    enabled: bool = False
    metric: str = "seq_score"
    max_rounds: int = 10
    accept_partial: bool = False

    def __post_init__(self) -> None:
        check(self.max_rounds >= 0, "max_rounds", self.max_rounds, ">= 0 (0: no cap)")


@dataclass
class OverlongConfig:
    """DAPO's soft overlong punishment: the last `buffer_length` tokens before
    `data.max_response_length` cost up to `penalty_factor` (null length: a quarter of
    the maximum response length)."""

    enabled: bool = False
    buffer_length: int | None = None
    penalty_factor: float = 1.0

    def __post_init__(self) -> None:
        _optional_positive(self, "buffer_length")
        check(self.penalty_factor >= 0, "penalty_factor", self.penalty_factor, ">= 0")


@dataclass
class AlgorithmConfig:
    """The RL algorithm: `preset` (one of rl_algos.config.PRESETS: ppo, grpo, dr_grpo, dapo,
    gspo, rloo, reinforce_pp, remax, opo, gpg, cispo, gmpo, sapo, clip_cov, kl_cov, dppo)
    sets fields of every section; then the advantage estimator and its knobs, KL in the
    reward, DAPO's dynamic sampling and overlong shaping."""

    preset: str | None = None
    adv_estimator: str = "grpo"
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "k1"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    overlong: OverlongConfig = field(default_factory=OverlongConfig)

    def __post_init__(self) -> None:
        check(0 <= self.gamma <= 1, "gamma", self.gamma, "in [0, 1]")
        check(0 <= self.lam <= 1, "lam", self.lam, "in [0, 1]")
        check(
            self.kl_penalty in KL_TYPES,
            "kl_penalty",
            self.kl_penalty,
            f"one of {list(KL_TYPES)}",
            KL_TYPES,
        )


@dataclass
class AsyncConfig:
    """Asynchronous training (the `async` section): rollout and training overlap.

    max_staleness: how many policy versions a trained sample may lag behind the trainer
    (0: synchronous, every batch is generated by the current weights; 1: one-step
    off-policy, the next batch is generated while this one trains; k: fully async).
    The off-policy correction of stale samples is `actor.loss.rollout_correction` (null
    there: decoupled PPO with cap 2 when max_staleness > 0).
    on_resume: what a checkpoint does with generated-but-untrained samples: `keep` (saved
    with it and trained after resuming) or `regenerate` (the data loader rewinds to the
    oldest untrained batch; its prompts are generated again)."""

    max_staleness: int = 0
    on_resume: Literal["keep", "regenerate"] = "keep"
    RENAMED: ClassVar[dict[str, str]] = {
        "correction": "actor.loss.rollout_correction (tis: {rollout_is: token, "
        "rollout_is_threshold: CAP}; decoupled_ppo: {rollout_is: token, rollout_is_threshold: "
        '"0_CAP"}; none: {})',
        "imp_weight_cap": "actor.loss.rollout_correction.rollout_is_threshold",
    }

    def __post_init__(self) -> None:
        check(self.max_staleness >= 0, "max_staleness", self.max_staleness, ">= 0 (0: synchronous)")


@dataclass
class TrainerConfig:
    """The run: steps, seed, output, logging, validation, checkpoints, resume and where
    the workers run.

    backend: `ray` (worker processes) or `local` (one in-process worker, for debugging);
    nnodes x num_workers training processes (the critic's placement is
    `critic.placement`, the rollout's `rollout.placement`). resume: null, `latest` or a checkpoint
    directory. Every remote call times out after `call_timeout_s`."""

    project: str = "rl"
    run_name: str = "run"
    output_dir: str = "outputs/${trainer.run_name}"
    seed: int = 0
    total_steps: int = 100
    loggers: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    progress_bar: bool = True
    val_every: int = 0
    val_before_train: bool = True
    save_every: int = 0
    max_checkpoints: int | None = 3
    resume: str | None = None
    critic_warmup: int = 0
    call_timeout_s: float = 600.0
    max_restarts: int = 2
    """Failover (Ray backend): how many times a run rebuilds a worker group whose process
    died or hung and continues from the newest in-memory snapshot (`snapshot_every`), else
    the newest intact checkpoint (`save_every`); past it the run stops with the worker's
    error. 0: never. With the Ray backend, > 0 needs `snapshot_every` or `save_every`
    (else a lost worker would send the run back to step 0: refused)."""
    snapshot_every: int = 1
    """In-memory snapshots (Ray backend): after every this many steps each training rank
    copies its shard of the trained weights, optimizer state, LR schedule and RNG states to
    host memory, in the background, and sends it to a holder process outside its worker
    group (one per node, no CPU reserved); the driver keeps its own state (data loader and
    sampler, KL controller, step, untrained async batches). Failover restores the newest
    complete snapshot, so a lost worker costs the step in flight, replayed exactly. Host
    memory: one copy is each rank's shard of the trained parameters and their optimizer
    state (AdamW with fp32 weights: 12 bytes per trained parameter, e.g. 84 GB for a 7B
    model, split over the FSDP ranks or, with megatron's distributed optimizer, over all
    TP x PP x DP ranks: each holds 1/DP of its shard's fp32 main weights and moments; the
    compute-dtype model is not copied, it is all-gathered again on restore); the holders
    keep 2 copies (the newest complete
    and the next), each rank 1 staging copy (page-locked on accelerators) and a send passes
    through Ray's object store (1 more, freed at once): about 3-4 copies in all. 0: off."""
    restart_backoff_s: float = 2.0
    """Wait before the first rebuild; doubled for each further one."""
    heartbeat_timeout_s: float = 60.0
    """A worker process that does not answer the heartbeat this long while a call runs is
    taken as hung (then failover), long before `call_timeout_s`. The heartbeat runs on a
    thread of its own: it catches a frozen interpreter, not a rank waiting inside a
    collective (that one answers: `collective_timeout_s`)."""
    collective_timeout_s: float | None = None
    """Every process group of the training engines times out its collectives after this
    long (null: half of `call_timeout_s`, 300 s by default; gloo raises, NCCL's watchdog
    aborts), less than `call_timeout_s`: a rank stuck in
    a collective whose peer never joins (a recv that never comes) fails its call with a
    `WorkerHungError` naming the role, rank and operation, and the run fails over. Longer
    than any wait inside a collective: ranks in a barrier while rank 0 writes and hashes a
    checkpoint wait that long."""
    RENAMED: ClassVar[dict[str, str]] = {
        "placement": "critic.placement",
        "critic_workers": "critic.num_workers",
    }

    backend: Literal["ray", "local"] = "ray"
    nnodes: int = 1
    num_workers: int = 1
    cpus_per_worker: float | None = None
    """CPUs reserved per worker process; on the CPU platform also its intra-op threads.
    null: on CPU, the node's free CPUs split evenly among the node's workers (one worker on 2
    cores: 1 process x 2 threads, measured faster than 2 FSDP ranks x 1 thread by
    benchmarks/grpo_step.py --workers 1 2); on accelerators, 1."""
    ray_num_cpus: int | None = None
    platform: str | None = None
    """Workers' hardware platform (cpu, cuda, rocm, npu; null: from the cluster's
    resources, never from the driver's hardware)."""
    gpus_per_worker: float | None = None
    """Accelerators per worker process (null: 1 on accelerator platforms, 0 on CPU)."""

    @property
    def group_timeout_s(self) -> float:
        """The process groups' time-out in force: `collective_timeout_s`, or half of
        `call_timeout_s` when it is null."""
        given = self.collective_timeout_s
        return self.call_timeout_s / 2 if given is None else given

    def __post_init__(self) -> None:
        _positive(self, "total_steps", "nnodes", "num_workers")
        _optional_positive(self, "max_checkpoints", "ray_num_cpus")
        for name in ("val_every", "save_every", "critic_warmup"):
            value = getattr(self, name)
            check(value >= 0, name, value, ">= 0 (0: never)" if "every" in name else ">= 0")
        check(self.call_timeout_s > 0, "call_timeout_s", self.call_timeout_s, "> 0 seconds")
        check(self.max_restarts >= 0, "max_restarts", self.max_restarts, ">= 0 (0: never)")
        check(self.snapshot_every >= 0, "snapshot_every", self.snapshot_every, ">= 0 (0: off)")
        # failover with nothing to restore but the initial weights: a silent rewind
        check(self.backend != "ray" or not self.max_restarts or self.snapshot_every
              or self.save_every, "max_restarts", self.max_restarts,
              "0 with trainer.snapshot_every=0 and trainer.save_every=0 (a lost worker would "
              "send the run back to step 0): set trainer.snapshot_every >= 1 (in-memory "
              "snapshots) or trainer.save_every >= 1 (checkpoints), or trainer.max_restarts=0")  # fmt: skip
        check(
            self.restart_backoff_s >= 0, "restart_backoff_s", self.restart_backoff_s, ">= 0 seconds"
        )
        check(
            self.heartbeat_timeout_s > 0,
            "heartbeat_timeout_s",
            self.heartbeat_timeout_s,
            "> 0 seconds",
        )
        check(0 < self.group_timeout_s < self.call_timeout_s, "collective_timeout_s",
              self.collective_timeout_s, f"> 0 seconds and < trainer.call_timeout_s="
              f"{self.call_timeout_s:g} (a collective that hangs must fail before the call "
              "that runs it)")  # fmt: skip
        check(
            self.cpus_per_worker is None or self.cpus_per_worker > 0,
            "cpus_per_worker",
            self.cpus_per_worker,
            "null (the node's CPUs split among its workers, on CPU) or a number > 0",
        )
        check(
            self.gpus_per_worker is None or self.gpus_per_worker >= 0,
            "gpus_per_worker",
            self.gpus_per_worker,
            "null (1 on accelerator platforms) or a number >= 0",
        )
        for i, name in enumerate(self.loggers):
            check(name in LOGGERS, f"loggers[{i}]", name, f"one of {list(LOGGERS)}", LOGGERS)
        check(
            self.backend == "ray" or self.num_workers * self.nnodes == 1,
            "num_workers",
            self.num_workers,
            "1 with backend 'local' (one in-process worker); use backend 'ray' for more",
        )


@dataclass
class RLConfig:
    """The whole experiment (see rl_algos.config.load_config)."""

    model: PolicyModelConfig = field(default_factory=PolicyModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    rollout: RolloutSectionConfig = field(default_factory=RolloutSectionConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    async_: AsyncConfig = field(default_factory=AsyncConfig, metadata={"key": "async"})
    """The ``async`` section (a Python keyword, hence the field name)."""
    env: EnvConfig | None = None
    """The environments episodes run in (rl_algos.config.env_section); null: prompts from
    `data` and a reward function, no environment."""
    distill: DistillConfig = field(default_factory=DistillConfig)
    """On-policy distillation from a teacher model (rl_algos.config.distill_section)."""
    vla: VLAConfig | None = None
    """A VLA policy and its episodes (rl_algos.config.vla_section); only with a VLA
    environment in `env` (null there: the defaults)."""

    @property
    def uses_critic(self) -> bool:
        """GAE needs a value model."""
        return self.algorithm.adv_estimator == "gae"

    @property
    def uses_reference(self) -> bool:
        """A KL term (in the loss or in the reward) needs the reference policy."""
        return self.actor.loss.kl_loss_coef > 0 or self.algorithm.use_kl_in_reward

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts (for logging and saving next to the run), with the YAML's
        section names (``async``)."""
        data = dataclasses.asdict(self)
        data["async"] = data.pop("async_")
        return data

    def to_yaml(self) -> str:
        """The resolved config as YAML; `load_config` reads it back to the same config."""
        from omegaconf import OmegaConf

        return OmegaConf.to_yaml(OmegaConf.create(self.to_dict()))

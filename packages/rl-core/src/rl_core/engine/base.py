"""The training-engine contract: `TrainEngine`, the loss-function signature, the registry.

An algorithm hands the engine a *loss function*; the engine owns the model, parallelism,
micro-batching, gradient accumulation, optimizer, LR schedule, checkpoints, offload and
weight export. The same algorithm code runs on any engine (FSDP2, Megatron, third-party).

Loss-function contract::

    loss_fn(outputs: dict[str, Tensor], micro_batch: DataProto, ctx: LossContext)
        -> tuple[Tensor, dict[str, float]]

* ``outputs`` holds what the engine was asked for, for the response tokens of the
  micro-batch: ``"log_probs"`` [b, R] (at ``ctx.temperature``), ``"entropy"`` [b, R],
  ``"values"`` [b, R] (value models). They carry gradients.
* The returned loss is a **sum-style partial**: the engine sums gradients over
  micro-batches and over data-parallel ranks, never averages. A loss normalised by
  ``ctx.global_num_tokens`` (or ``ctx.global_num_seqs``), the counts of the whole
  mini-batch on all ranks, therefore gives the same gradient for any DP size and any
  micro-batch split. The returned metrics follow the same rule: the engine sums each over
  micro-batches and ranks (normalise by the global counts to report means).

Where tensors live (the device contract; the conformance suite checks it):

* ``train_batch``/``infer_batch`` accept batches on any device (the controller sends them
  in host memory).
* The loss function receives ``outputs`` **and every tensor of the micro-batch on the
  engine's device** (`TrainEngine.device`): a loss never moves data itself.
* `infer_batch` returns CPU tensors; so does everything else an engine hands back to its
  caller (metrics are Python floats). `export_weights` yields tensors on the engine's
  device (the rollout side moves them where it needs them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from rl_core.config import build
from rl_core.engine.config import EngineConfig, MicroBatchConfig
from rl_core.engine.functional import (
    count_token_budget_parts,
    partition_by_count,
    partition_by_token_budget,
)
from rl_core.engine.snapshot import SnapshotView
from rl_core.registry import Registry

if TYPE_CHECKING:
    from rl_core.protocol import DataProto

from rl_core.engine.weight_buckets import DEFAULT_BUCKET_BYTES

__all__ = [
    "ENGINES",
    "INFER_KEYS",
    "OUTPUT_KINDS",
    "TRAIN_KEYS",
    "LossContext",
    "LossFn",
    "TrainEngine",
    "build_engine",
    "check_batch",
    "check_outputs",
    "local_micro_batch_count",
    "split_micro_batches",
]

TRAIN_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
INFER_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")
OUTPUT_KINDS = ("log_probs", "entropy", "values")


@dataclass(frozen=True)
class LossContext:
    """What a loss function needs to aggregate correctly for any DP layout/micro-batching.

    ``global_num_tokens``: ``response_mask.sum()`` over the whole mini-batch on all DP
    ranks; ``global_num_seqs``: its sequences on all DP ranks.
    """

    global_num_tokens: int
    global_num_seqs: int
    dp_size: int
    micro_batch_index: int
    num_micro_batches: int
    temperature: float = 1.0


LossFn = Callable[[dict[str, Tensor], "DataProto", LossContext], tuple[Tensor, dict[str, float]]]

ENGINES: Registry[Callable[[EngineConfig], TrainEngine]] = Registry(
    "rl.engines", kind="training engine"
)
"""Training engines by name: ``fsdp`` (rl-engines[fsdp]), ``megatron``, or your own."""


class TrainEngine(ABC):
    """A model being trained, sharded over the ranks of one SPMD worker group.

    Every method is collective: all ranks of the group call it in the same order (the
    worker group does this). Batches passed in are this rank's data-parallel shard.
    """

    config: EngineConfig
    #: Whether `load` restores a checkpoint written at another world size (the
    #: conformance suite then checks 2 -> 1 ranks; otherwise such a load must raise).
    supports_resharding: ClassVar[bool] = False
    #: Whether the engine trains LoRA adapters (``ModelConfig.lora``) and implements
    #: `adapters_disabled`; an engine that does not refuses ``model.lora`` when built, and
    #: a trainer can check this before starting any worker.
    supports_lora: ClassVar[bool] = False
    #: The dataclass of this engine's own options (``EngineConfig.engine_kwargs``), built
    #: by `parse_options`; None: the engine reads them itself (not checked ahead).
    options_class: ClassVar[type | None] = None
    #: Whether `snapshot_view` and `restore_snapshot` are implemented: in-memory snapshots
    #: of this rank's training state (`rl_core.engine.snapshot`), which a trainer's failover
    #: restores instead of a checkpoint.
    supports_snapshots: ClassVar[bool] = False

    @classmethod
    def parse_options(cls, config: EngineConfig) -> Any:
        """This engine's typed options from ``config.engine_kwargs``, checked the way
        `rl_core.config.build` checks (errors name ``engine_kwargs.<key>``). A trainer calls
        it on the driver before any worker starts; the engine calls it in ``__init__``.
        Engines whose options depend on other sections (e.g. parallel sizes) override it."""
        if cls.options_class is None:  # the engine reads engine_kwargs itself
            return dict(config.engine_kwargs)
        return build(cls.options_class, config.engine_kwargs, "engine_kwargs")

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """The device this rank computes on (chosen by the `rl_core.platform` Platform)."""

    @property
    @abstractmethod
    def dp_rank(self) -> int:
        """This rank's index among data-parallel ranks (which batch shard it gets)."""

    @property
    @abstractmethod
    def dp_size(self) -> int:
        """Number of data-parallel ranks (the batch is split this many ways)."""

    @property
    @abstractmethod
    def is_collect_rank(self) -> bool:
        """Whether this rank's outputs are kept (e.g. TP rank 0 of the last PP stage)."""

    @property
    @abstractmethod
    def global_step(self) -> int:
        """Optimizer steps taken so far (restored by `load`)."""

    @abstractmethod
    def train_batch(
        self, batch: DataProto, loss_fn: LossFn, outputs: Sequence[str] | None = None
    ) -> dict[str, float]:
        """One optimizer step on this mini-batch shard (``EngineConfig.inference_only``
        engines raise RuntimeError: they hold no optimizer).

        Splits into micro-batches (`EngineConfig.micro_batch`), accumulates gradients of
        ``loss_fn`` (see the module docstring), clips by global norm, steps the optimizer
        and the LR schedule. ``outputs`` defaults to ``("values",)`` for value models and
        ``("log_probs",)`` otherwise; the temperature is ``batch.meta_info["temperature"]``
        (default 1.0). Returns metrics identical on every rank: ``loss`` (summed over
        micro-batches and ranks), ``grad_norm`` (before clipping), ``lr``, ``num_tokens``,
        ``num_seqs``, ``num_micro_batches``, ``skipped`` and the loss function's metrics.
        """

    @abstractmethod
    def infer_batch(
        self,
        batch: DataProto,
        outputs: Sequence[str] = ("log_probs",),
        temperature: float | None = None,
    ) -> DataProto:
        """No-grad forward: a DataProto with the requested [B, R] fields, in batch order.

        ``outputs`` from ``("log_probs", "entropy")`` (causal LMs) or ``("values",)``;
        ``temperature`` None means ``batch.meta_info.get("temperature", 1.0)``.
        """

    @abstractmethod
    def export_weights(
        self, bucket_bytes: int = DEFAULT_BUCKET_BYTES, dtype: Any = None
    ) -> Iterator[list[tuple[str, Tensor]]]:
        """Full (unsharded) weights under Hugging Face names, in buckets of at most
        ``bucket_bytes`` made by `rl_core.engine.iter_layer_buckets` (whole layers; a
        larger layer is a bucket of its own), cast to ``dtype`` if
        given. Collective: every rank must consume the iterator to its end."""

    @abstractmethod
    def save(self, path: str) -> None:
        """Checkpoint model, optimizer, scheduler, RNG states and step into directory
        ``path`` atomically (written elsewhere, then renamed into place)."""

    @abstractmethod
    def load(self, path: str) -> None:
        """Restore a checkpoint written by `save`; training then continues bit-exactly."""

    def snapshot_view(self) -> SnapshotView:
        """This rank's training state for an in-memory snapshot (collective-free, cheap):
        ``state`` (picklable values: optimizer step count, LR schedule, RNG states,
        optimizer hyper-parameters) and ``tensors`` (name -> this rank's live shards of the
        trainable parameters and optimizer state, not copies: copy them before the next
        `train_batch`, `load` or `restore_snapshot`). Engines that set
        ``supports_snapshots`` implement it."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support in-memory snapshots "
            "(TrainEngine.supports_snapshots is False)"
        )

    def restore_snapshot(self, state: dict[str, Any], tensors: Mapping[str, Tensor]) -> None:
        """Restore what `snapshot_view` gave on this rank (``tensors``: copies, on any
        device, under the same names and shapes) into an engine built from the same config
        and layout; training then continues bit-exactly. A name, shape or dtype that does
        not fit raises ValueError naming it."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support in-memory snapshots "
            "(TrainEngine.supports_snapshots is False)"
        )

    @abstractmethod
    def offload(self) -> None:
        """Release device memory: parameters, gradients and optimizer state go to host
        memory (on an accelerator, device memory in use falls by their size)."""

    @abstractmethod
    def onload(self) -> None:
        """Bring back what `offload` moved; results are unchanged."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (optional)."""

    def adapters_disabled(self) -> AbstractContextManager[None]:
        """A context in which forward passes run the base model, adapters off (the
        reference policy of a LoRA run, without a second copy). Engines that train
        adapters (``ModelConfig.lora``) implement it."""
        raise NotImplementedError(
            f"{type(self).__name__} does not train adapters: adapters_disabled() is unavailable"
        )

    @classmethod
    def read_checkpoint_weights(cls, path: str) -> dict[str, Tensor]:
        """Offline, in one process without a process group: the full model weights of a
        checkpoint that `save` wrote to ``path``, on CPU, under the Hugging Face names that
        `export_weights` uses (what ``rl export`` turns into a model directory). Engines
        override it; the default says that this engine's checkpoints cannot be exported."""
        raise NotImplementedError(
            f"{cls.__name__} does not implement read_checkpoint_weights: its checkpoint "
            f"{path!r} cannot be exported offline (expected an engine that overrides "
            "TrainEngine.read_checkpoint_weights)"
        )


def build_engine(name: str, config: EngineConfig | dict[str, Any]) -> TrainEngine:
    """Validate ``config`` and build the engine registered as ``name``.

    An unknown name raises `UnknownPluginError` listing the installed engines; an engine
    whose extra is missing raises `PluginLoadError` naming the extra to install.
    """
    if isinstance(config, dict):
        config = EngineConfig.from_dict(config)
    if not isinstance(config, EngineConfig):
        raise TypeError(
            f"build_engine expects an EngineConfig or a dict, got {type(config).__name__}"
        )
    factory = ENGINES.get(name)
    config.validate()
    engine = factory(config)
    if not isinstance(engine, TrainEngine):
        raise TypeError(
            f"training engine {name!r} built a {type(engine).__name__}, which is not a "
            "rl_core.engine.TrainEngine"
        )
    return engine


def check_outputs(outputs: Sequence[str], value_model: bool) -> tuple[str, ...]:
    """Validate requested output kinds for a (value) model; return them as a tuple."""
    if isinstance(outputs, str):
        outputs = (outputs,)
    outputs = tuple(outputs)
    allowed = ("values",) if value_model else ("log_probs", "entropy")
    bad = [o for o in outputs if o not in allowed]
    if bad or not outputs:
        kind = "a value model" if value_model else "a causal LM"
        raise ValueError(f"outputs={outputs!r} is invalid for {kind}: expected some of {allowed}")
    return outputs


def check_batch(batch: DataProto, required: Sequence[str] = TRAIN_KEYS) -> tuple[int, int, int]:
    """Check an RL batch follows the layout convention; return (B, S, R).

    ``input_ids``/``attention_mask``/``position_ids`` are [B, S], ``responses`` and
    ``response_mask`` [B, R] with R < S, and the responses are the last R input ids.
    Raises ValueError naming the field, its shape and what was expected.
    """
    tensors = getattr(batch, "batch", None)
    if tensors is None:
        raise ValueError(
            f"batch has no tensor fields: expected {list(required)} (an RL batch DataProto)"
        )
    keys = set(tensors.keys())
    missing = [k for k in required if k not in keys]
    if missing:
        raise ValueError(
            f"batch is missing field(s) {missing}: expected {list(required)}; got {sorted(keys)}"
        )
    input_ids = tensors["input_ids"]
    if input_ids.dim() != 2 or input_ids.dtype.is_floating_point:
        raise ValueError(
            f"batch['input_ids'] has shape {tuple(input_ids.shape)} and dtype "
            f"{input_ids.dtype}: expected integer token ids of shape [B, S]"
        )
    num_seqs, seq_len = input_ids.shape
    if num_seqs == 0:
        raise ValueError("batch is empty: expected at least one sequence")
    for key in ("attention_mask", "position_ids"):
        if key in keys and tuple(tensors[key].shape[-1:]) != (seq_len,):
            raise ValueError(
                f"batch[{key!r}] has shape {tuple(tensors[key].shape)}: expected [B, S] = "
                f"{[num_seqs, seq_len]} like input_ids"
            )
    responses = tensors["responses"]
    if responses.dim() != 2 or not 0 < responses.shape[1] < seq_len:
        raise ValueError(
            f"batch['responses'] has shape {tuple(responses.shape)}: expected [B, R] with "
            f"0 < R < S = {seq_len} (input_ids = prompts + responses)"
        )
    resp_len = responses.shape[1]
    if "response_mask" in keys and tuple(tensors["response_mask"].shape) != (num_seqs, resp_len):
        raise ValueError(
            f"batch['response_mask'] has shape {tuple(tensors['response_mask'].shape)}: "
            f"expected [B, R] = {[num_seqs, resp_len]} like responses"
        )
    if not bool((input_ids[:, -resp_len:] == responses).all()):
        raise ValueError(
            "batch['responses'] differs from the last R columns of batch['input_ids']: "
            "expected input_ids = cat(prompts, responses)"
        )
    return num_seqs, seq_len, resp_len


def _sequence_lengths(batch: DataProto) -> list[int]:
    return [int(n) for n in batch.batch["attention_mask"].sum(-1).tolist()]


def local_micro_batch_count(batch: DataProto, config: MicroBatchConfig) -> int:
    """The fewest micro-batches this rank's shard needs under ``config``."""
    n = len(batch)
    if config.micro_batch_size is not None:
        return -(-n // config.micro_batch_size)
    if config.max_tokens_per_micro_batch is not None:
        return count_token_budget_parts(_sequence_lengths(batch), config.max_tokens_per_micro_batch)
    return 1


def split_micro_batches(
    batch: DataProto, config: MicroBatchConfig, num_micro_batches: int
) -> list[tuple[DataProto, list[int]]]:
    """Cut ``batch`` into exactly ``num_micro_batches`` (the count all DP ranks agreed on).

    Returns (micro_batch, indices into ``batch``) pairs; the indices of all pairs together
    are a permutation of ``range(len(batch))``.
    """
    if config.max_tokens_per_micro_batch is not None:
        parts = partition_by_token_budget(
            _sequence_lengths(batch), config.max_tokens_per_micro_batch, num_micro_batches
        )
        if len(parts) != num_micro_batches:
            raise RuntimeError(
                f"token-budget split made {len(parts)} micro-batches, expected {num_micro_batches}"
            )
    else:
        parts = partition_by_count(len(batch), num_micro_batches)
    return [(batch[indices], indices) for indices in parts]

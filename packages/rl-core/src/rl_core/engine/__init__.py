"""Training-engine contract: `TrainEngine`, its configs, the loss-function contract, registry.

Implementations live in rl-engines (``fsdp``, ``megatron``) or in third-party packages
registering under the ``rl.engines`` entry point group; every implementation runs the
conformance suite in ``rl_core.testing.train_engine``. See `rl_core.engine.base` for the
loss-function contract (sum-style partial losses normalised by global token counts).
"""

from rl_core.engine.base import (
    ENGINES,
    INFER_KEYS,
    OUTPUT_KINDS,
    TRAIN_KEYS,
    LossContext,
    LossFn,
    TrainEngine,
    build_engine,
    check_batch,
    check_outputs,
    local_micro_batch_count,
    split_micro_batches,
)
from rl_core.engine.config import (
    EngineConfig,
    LoRAConfig,
    MicroBatchConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
)
from rl_core.engine.functional import (
    entropy_from_logits,
    linear_log_probs_and_entropy,
    partition_by_count,
    partition_by_token_budget,
    token_log_probs,
    token_log_probs_and_entropy,
)
from rl_core.engine.models import MODEL_BUILDERS, RLModel
from rl_core.engine.snapshot import HostSnapshot, SnapshotView
from rl_core.engine.weight_buckets import (
    DEFAULT_BUCKET_BYTES,
    iter_layer_buckets,
    layer_of,
    tensor_nbytes,
)

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "ENGINES",
    "INFER_KEYS",
    "MODEL_BUILDERS",
    "OUTPUT_KINDS",
    "TRAIN_KEYS",
    "EngineConfig",
    "HostSnapshot",
    "LoRAConfig",
    "LossContext",
    "LossFn",
    "MicroBatchConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ParallelConfig",
    "RLModel",
    "SnapshotView",
    "TrainEngine",
    "build_engine",
    "check_batch",
    "check_outputs",
    "entropy_from_logits",
    "iter_layer_buckets",
    "layer_of",
    "linear_log_probs_and_entropy",
    "local_micro_batch_count",
    "partition_by_count",
    "partition_by_token_budget",
    "split_micro_batches",
    "tensor_nbytes",
    "token_log_probs",
    "token_log_probs_and_entropy",
]

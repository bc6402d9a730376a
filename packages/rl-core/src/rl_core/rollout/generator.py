"""The sequence-generator contract: prompts in, the RL batch layout out.

A trainer asks a `SequenceGenerator` for responses without knowing which rollout backend,
agent loop or tools produce them. rl-rollout registers its agent-loop rollout manager as
``agent_loop`` in the ``rl.sequence_generators`` entry point group; a third party can ship
its own (a remote inference service, an environment simulator, ...).

`generate_sequences` takes a DataProto whose rows are prompts (non-tensor ``raw_prompt_ids``
token-id lists, or ``raw_prompt`` chat messages) and returns one row per row with the
fields of the batch layout: ``prompts`` (left-padded), ``responses`` (right-padded),
``input_ids``, ``attention_mask``, ``position_ids``, ``response_mask``,
``rollout_log_probs``, and ``routed_experts`` when the engines record the routing of a
mixture-of-experts model (`rl_core.rollout.ROUTED_EXPERTS`); the input's non-tensor fields
and meta_info are carried over.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor

from rl_core.config import build
from rl_core.registry import Registry

if TYPE_CHECKING:
    from rl_core.protocol import DataProto
    from rl_core.rollout.base import RolloutEngine

__all__ = ["SEQUENCE_GENERATORS", "SequenceGenerator", "build_sequence_generator"]


class SequenceGenerator(ABC):
    """Turns a batch of prompts into a batch of rollouts (see the module docstring)."""

    #: The dataclass of this generator's config, built by `parse_config` (None: the
    #: generator takes the mapping as it is).
    config_class: ClassVar[type | None] = None

    @classmethod
    def parse_config(cls, data: Any) -> Any:
        """The typed config from a mapping (`rl_core.config.build`; errors name the key
        path); a trainer calls it on the driver and sends the result to its workers."""
        if cls.config_class is None or isinstance(data, cls.config_class):
            return data
        return build(cls.config_class, data, "")

    @abstractmethod
    def generate_sequences(self, batch: DataProto) -> DataProto:
        """One response per row, in row order, in the RL batch layout."""

    @abstractmethod
    def update_weights(
        self, weights: Iterable[tuple[str, Tensor]], version: int | None = None
    ) -> None:
        """Load new policy weights (Hugging Face names) into every engine replica: one
        update session per replica; ``version`` is the policy version they are (recorded
        per generated token)."""

    def weight_sender(self) -> Callable[[Iterable[list[tuple[str, Tensor]]], int], Any] | None:
        """A picklable callable ``send(buckets, version)`` that loads whole-layer weight
        buckets into this generator's engines from another process (a trainer's rank 0,
        split placement); None when the engines only take weights in process."""
        return None

    @abstractmethod
    def sleep(self, level: int = 1) -> None:
        """Free what generation holds (KV cache, and weights at level 2) between phases."""

    @abstractmethod
    def wake_up(self) -> None:
        """Restore what `sleep` freed."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop engines and release their resources."""


SequenceGeneratorFactory = Callable[..., SequenceGenerator]

SEQUENCE_GENERATORS: Registry[SequenceGeneratorFactory] = Registry(
    "rl.sequence_generators", kind="sequence generator"
)
"""Sequence generators by name: ``agent_loop`` (rl-rollout) or your own."""


def build_sequence_generator(
    name: str,
    config: Mapping[str, Any] | Any,
    *,
    tokenizer: Any = None,
    engine: RolloutEngine | None = None,
) -> SequenceGenerator:
    """Build the generator registered as `name` from its typed config (see
    `SequenceGenerator.parse_config`) or a plain mapping.

    ``engine``: an already-built `RolloutEngine` to generate with in this process (the
    colocated "hybrid engine" case); None lets the generator start its own replicas.
    """
    factory = SEQUENCE_GENERATORS.get(name)
    if isinstance(factory, type) and issubclass(factory, SequenceGenerator):
        config = factory.parse_config(config)
    elif isinstance(config, Mapping):
        config = dict(config)
    generator = factory(config, tokenizer=tokenizer, engine=engine)
    if not isinstance(generator, SequenceGenerator):
        raise TypeError(
            f"sequence generator {name!r} built a {type(generator).__name__}, which is not a "
            "rl_core.rollout.SequenceGenerator"
        )
    return generator

"""The VLA policy on a rollout engine: the ``vla`` sequence generator (``rl.sequence_generators``).

`VLAPolicyGenerator` puts the policy's heads on the VLM of the actor's colocated ``hf``
engine (in ``rollout.dtype``) and acts, one ``generate_sequences`` per policy step; weights
come by the LLM path (`update_weights`). Rows in: ``images``, ``proprio``, non-tensor
``instructions``, ``meta_info["greedy"]``; out: ``env_actions``, left-padded ``prompt_ids`` /
``prompt_mask``, ``log_probs``, ``values``, ``action_tokens`` or ``raw_actions`` (gaussian).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from rl_core.config import check
from rl_core.env import ActionSpec, EnvObservation
from rl_core.protocol import DataProto
from rl_core.rollout import RolloutConfig, RolloutEngine, SequenceGenerator
from rl_multimodal.vla.policy import VLAPolicy, VLAPolicyConfig, check_policy_fits, split_options

__all__ = ["VLAGeneratorConfig", "VLAPolicyGenerator", "act_on"]


@dataclass
class VLAGeneratorConfig:
    """The engine's config and the policy's (the ``vla`` builder's options)."""

    rollout: RolloutConfig
    policy: dict[str, Any] = field(default_factory=dict)
    placement: str = "colocated"

    def check(self) -> None:
        check(self.placement == "colocated", "placement", self.placement,
              "'colocated' in a VLA run (the policy acts in the actor's processes)")  # fmt: skip
        check({"action_low", "action_high"} <= set(self.policy), "policy", sorted(self.policy),
              "the env's action space (action_low, action_high)")  # fmt: skip

    def split(self) -> tuple[ActionSpec, VLAPolicyConfig]:
        return split_options(self.policy, "policy")


def act_on(policy: VLAPolicy, batch: DataProto) -> DataProto:
    """`policy`'s actions for the observation rows of `batch` (module docstring)."""
    obs = EnvObservation(
        batch.batch["images"].numpy(),
        batch.batch["proprio"].numpy(),
        list(batch.non_tensor_batch["instructions"]),
    )
    with torch.no_grad():
        inputs = policy.process(obs)
        device, dtype = next(policy.parameters()).device, policy._pixel_dtype()
        out = policy.act(inputs.to(device, dtype), greedy=bool(batch.meta_info.get("greedy")))
    tensors = {
        "env_actions": torch.from_numpy(out.env_actions),
        "prompt_ids": inputs.input_ids,
        "prompt_mask": inputs.attention_mask,
        "log_probs": out.log_probs.float().cpu(),
        "values": out.values.float().cpu(),
    }
    actions = out.actions.cpu()
    if actions.dtype.is_floating_point:
        tensors["raw_actions"] = actions.float()
    else:
        tensors["action_tokens"] = actions
    return DataProto.from_dict(tensors=tensors)


class VLAPolicyGenerator(SequenceGenerator):
    """A VLA policy on an in-process rollout engine's model (see the module docstring)."""

    config_class: ClassVar[type] = VLAGeneratorConfig

    @classmethod
    def parse_config(cls, data: Any) -> VLAGeneratorConfig:
        """The typed config; on the driver, before a worker starts: the model's vocabulary
        holds the action bins and the env's action space can be binned."""
        if isinstance(data, VLAGeneratorConfig):  # checked on the driver already
            return data
        config = super().parse_config(data)
        spec, policy = config.split()
        check_policy_fits(config.rollout.model_path, policy, spec)
        return config

    def __init__(
        self, config: Any, *, tokenizer: Any = None, engine: RolloutEngine | None = None
    ) -> None:
        from rl_multimodal.vlm.processor import load_processor

        config = self.parse_config(config)
        model = getattr(engine, "model", None)
        if not isinstance(model, torch.nn.Module):
            raise ValueError(
                f"rollout.generator='vla' needs an in-process rollout engine that holds the "
                f"model (rollout.backend='hf', rollout.placement='colocated'); got "
                f"{type(engine).__name__}"
            )
        spec, policy_config = config.split()
        self.engine, self.device = engine, getattr(engine, "device", torch.device("cpu"))
        dtype = next(model.parameters()).dtype
        processor = load_processor(config.rollout.model_path)
        self.policy = VLAPolicy(model, processor, spec, policy_config)
        self.policy.to(self.device, dtype).eval().requires_grad_(False)
        self.version = 0

    def generate_sequences(self, batch: DataProto) -> DataProto:
        out = act_on(self.policy, batch)
        out.meta_info["policy_version"] = self.version
        return out

    def update_weights(
        self, weights: Iterable[tuple[str, Tensor]], version: int | None = None
    ) -> None:
        """Every tensor of the policy (the VLM's under ``model.``, the heads') by name."""
        state = self.policy.state_dict()
        loaded: set[str] = set()
        with torch.no_grad():
            for name, tensor in weights:
                target = state.get(name)
                if target is None:
                    raise KeyError(f"update_weights: {name!r} is not a tensor of the VLA policy")
                target.copy_(tensor.to(target.device, target.dtype))
                loaded.add(name)
        missing = sorted(set(state) - loaded)
        if missing:
            raise RuntimeError(f"update_weights: no tensor for {missing[:4]} (of {len(missing)})")
        getattr(self.engine, "_unloaded", set()).clear()  # the engine's model is loaded now
        self.version = self.version + 1 if version is None else int(version)

    def export_metadata(self) -> dict[str, Any]:
        """What an export writes beside the weights (`VLAPolicy.export_metadata`)."""
        return self.policy.export_metadata()

    def sleep(self, level: int = 1) -> None:
        if self.device.type != "cpu":
            self.policy.to("cpu")

    def wake_up(self) -> None:
        self.policy.to(self.device)

    def shutdown(self) -> None:
        self.policy = None  # type: ignore[assignment]

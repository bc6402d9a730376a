"""The environment contract: batched, vectorised environments for VLA reinforcement learning.

A `VectorEnv` holds ``num_envs`` environments and follows the Gymnasium conventions,
batched:

* ``reset(seeds)`` starts one episode per environment from its seed (same seed, same
  episode) and returns an `EnvObservation`;
* ``step(actions)`` takes an *action chunk* per environment, ``[num_envs, chunk, action_dim]``
  float32, executes its ``chunk`` primitive actions in order and stops early when the
  episode ends; it returns an `EnvStep` whose reward is the sum over the executed actions;
* an environment whose episode has ended is *absorbing* until the next ``reset``: stepping
  it executes nothing, returns its last observation, reward 0 and the same done flags.

Observations are RGB images (uint8 ``[num_envs, H, W, 3]``), proprioception (float32
``[num_envs, P]``, ``P`` may be 0) and one language instruction per environment.
``info["success"]`` (bool ``[num_envs]``) says whether each episode has succeeded so far.

rl-core only states the contract; adapters (Gymnasium), worker processes and tasks live in
rl-multimodal (``rl_multimodal.vla``). Nothing here imports gymnasium.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "ActionSpec",
    "EnvObservation",
    "EnvStep",
    "VectorEnv",
    "check_action_chunk",
    "concat_observations",
]


@dataclass(frozen=True)
class ActionSpec:
    """Bounds of one primitive action (``low``/``high`` of shape ``[action_dim]``).

    ``max_chunk`` is the most primitive actions one ``step`` accepts per environment.
    """

    low: np.ndarray
    high: np.ndarray
    max_chunk: int = 1

    def __post_init__(self) -> None:
        low = np.asarray(self.low, dtype=np.float32).reshape(-1)
        high = np.asarray(self.high, dtype=np.float32).reshape(-1)
        if low.shape != high.shape or low.size == 0:
            raise ValueError(
                f"ActionSpec.low/high: shapes {low.shape} and {high.shape}, expected the same "
                "non-empty [action_dim] shape"
            )
        if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(low < high)):
            raise ValueError(f"ActionSpec: low {low} and high {high}, expected finite low < high")
        if int(self.max_chunk) < 1:
            raise ValueError(f"ActionSpec.max_chunk is {self.max_chunk}, expected >= 1")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    @property
    def action_dim(self) -> int:
        return int(self.low.size)


@dataclass
class EnvObservation:
    """One observation per environment: RGB images, proprioception, instructions."""

    images: np.ndarray  # uint8 [B, H, W, 3]
    proprio: np.ndarray  # float32 [B, P]
    instructions: list[str]

    def __post_init__(self) -> None:
        images = np.asarray(self.images)
        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
            raise ValueError(
                f"EnvObservation.images: dtype {images.dtype} shape {images.shape}, "
                "expected uint8 [num_envs, H, W, 3]"
            )
        proprio = np.asarray(self.proprio, dtype=np.float32)
        if proprio.ndim == 1 and proprio.size == 0:
            proprio = proprio.reshape(len(images), 0)
        if proprio.ndim != 2 or len(proprio) != len(images):
            raise ValueError(
                f"EnvObservation.proprio: shape {proprio.shape}, expected [{len(images)}, P]"
            )
        if len(self.instructions) != len(images):
            raise ValueError(
                f"EnvObservation.instructions: {len(self.instructions)} strings, expected "
                f"{len(images)} (one per environment)"
            )
        self.images = images
        self.proprio = proprio
        self.instructions = [str(t) for t in self.instructions]

    def __len__(self) -> int:
        return len(self.images)

    def select(self, index: Sequence[int] | np.ndarray) -> EnvObservation:
        idx = np.asarray(index, dtype=np.int64)
        return EnvObservation(
            self.images[idx], self.proprio[idx], [self.instructions[i] for i in idx.tolist()]
        )


@dataclass
class EnvStep:
    """What ``VectorEnv.step`` returns for one action chunk per environment."""

    observation: EnvObservation
    reward: np.ndarray  # float32 [B]: sum over the executed primitive actions
    terminated: np.ndarray  # bool [B]
    truncated: np.ndarray  # bool [B]
    info: dict[str, Any] = field(default_factory=dict)  # "success": bool [B] at least

    def __post_init__(self) -> None:
        n = len(self.observation)
        self.reward = np.asarray(self.reward, dtype=np.float32).reshape(-1)
        self.terminated = np.asarray(self.terminated, dtype=bool).reshape(-1)
        self.truncated = np.asarray(self.truncated, dtype=bool).reshape(-1)
        for name in ("reward", "terminated", "truncated"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"EnvStep.{name}: {len(getattr(self, name))} values, expected {n}")
        if "success" not in self.info:
            raise ValueError("EnvStep.info has no 'success' entry (bool [num_envs])")
        self.info["success"] = np.asarray(self.info["success"], dtype=bool).reshape(-1)
        if len(self.info["success"]) != n:
            raise ValueError(
                f"EnvStep.info['success']: {len(self.info['success'])} values, expected {n}"
            )

    @property
    def done(self) -> np.ndarray:
        return self.terminated | self.truncated


@runtime_checkable
class VectorEnv(Protocol):
    """A batch of ``num_envs`` environments (see the module docstring for the semantics)."""

    num_envs: int
    action_spec: ActionSpec

    def reset(self, seeds: Sequence[int]) -> EnvObservation: ...

    def step(self, actions: np.ndarray) -> EnvStep: ...

    def close(self) -> None: ...


def check_action_chunk(actions: Any, spec: ActionSpec, num_envs: int) -> np.ndarray:
    """`actions` as float32 ``[num_envs, chunk, action_dim]``, or one clear ValueError.

    A ``[num_envs, action_dim]`` array is a chunk of one. Values must be finite; they are not
    clipped here (the environment's own action space decides).
    """
    arr = np.asarray(actions, dtype=np.float32)
    if arr.ndim == 2:
        arr = arr[:, None, :]
    if arr.ndim != 3 or arr.shape[0] != num_envs or arr.shape[2] != spec.action_dim:
        raise ValueError(
            f"actions: shape {np.shape(actions)}, expected [{num_envs}, chunk, {spec.action_dim}]"
        )
    if not 1 <= arr.shape[1] <= spec.max_chunk:
        raise ValueError(f"actions: chunk length {arr.shape[1]}, expected 1..{spec.max_chunk}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("actions: contains NaN or infinite values")
    return arr


def concat_observations(parts: Sequence[EnvObservation]) -> EnvObservation:
    """The observations of several env batches, in order, as one batch."""
    return EnvObservation(
        np.concatenate([p.images for p in parts]),
        np.concatenate([p.proprio for p in parts]),
        [t for p in parts for t in p.instructions],
    )

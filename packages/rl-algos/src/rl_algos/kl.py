"""KL divergence to the reference policy: per-token estimators, coefficient controllers
and the KL-in-reward penalty.

Estimators of KL(pi || pi_ref) from samples of pi (Schulman), r = pi_ref / pi: ``k1``
(verl ``kl``) log pi - log pi_ref; ``k2`` (``mse``) 0.5 (log pi - log pi_ref)^2; ``k3``
(``low_var_kl``) r - log r - 1, log-ratio clamped to [-20, 20] and value to [-10, 10];
``abs``. ``k1+``, ``k3+``/``low_var_kl+``: k1/k3's value with k2's gradient,
``k2 - sg(k2) + sg(k)``, whose expectation is the KL's gradient (Tang & Munos 2025): use
these as a loss term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rl_algos.masked import masked_mean

__all__ = [
    "KL_TYPES",
    "AdaptiveKLController",
    "FixedKLController",
    "KLController",
    "apply_kl_penalty",
    "kl_penalty",
    "make_kl_controller",
]

_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3", "low_var_kl+": "k3+"}
_STRAIGHT_THROUGH = ("k1+", "k3+")
KL_TYPES: tuple[str, ...] = ("k1", "k2", "k3", "abs", *_STRAIGHT_THROUGH, *_ALIASES)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_type: str) -> torch.Tensor:
    """Per-token KL estimate of the given type (see the module docstring)."""
    kind = _ALIASES.get(kl_type, kl_type)
    if kind in _STRAIGHT_THROUGH:
        value = kl_penalty(log_prob, ref_log_prob, kind[:-1])
        k2 = 0.5 * (log_prob - ref_log_prob).square()
        return k2 - k2.detach() + value.detach()
    diff = log_prob - ref_log_prob
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff.square()
    if kind == "abs":
        return diff.abs()
    if kind == "k3":
        log_ratio = (-diff).clamp(-20.0, 20.0)
        return (log_ratio.exp() - log_ratio - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kl_type!r}; expected one of {list(KL_TYPES)}")


@dataclass
class FixedKLController:
    """A constant KL coefficient."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        del current_kl, n_steps

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


@dataclass
class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019): moves the coefficient so that the
    observed KL approaches `target_kl`, at a rate set by `horizon` (in samples)."""

    value: float
    target_kl: float
    horizon: int

    def __post_init__(self) -> None:
        if self.target_kl <= 0 or self.horizon <= 0:
            raise ValueError(
                f"adaptive KL controller needs target_kl > 0 and horizon > 0, got "
                f"target_kl={self.target_kl}, horizon={self.horizon}"
            )

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


KLController = FixedKLController | AdaptiveKLController


def make_kl_controller(
    controller: str, coef: float, target_kl: float | None = None, horizon: int | None = None
) -> KLController:
    """Build a `fixed` or `adaptive` controller."""
    if controller == "fixed":
        return FixedKLController(coef)
    if controller == "adaptive":
        if target_kl is None or horizon is None:
            raise ValueError("the adaptive KL controller needs target_kl and horizon")
        return AdaptiveKLController(coef, target_kl, horizon)
    raise ValueError(f"unknown KL controller {controller!r}; expected 'fixed' or 'adaptive'")


@torch.no_grad()
def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    controller: Any,
    kl_type: str = "k1",
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL in the reward: token_level_rewards = scores - beta * KL per token. Updates the
    controller with the batch's mean per-sequence KL and returns (rewards, metrics)."""
    mask = response_mask.to(token_level_scores.dtype)
    kld = kl_penalty(old_log_probs, ref_log_prob, kl_type) * mask
    beta = controller.value
    rewards = token_level_scores - beta * kld
    current_kl = masked_mean(kld, mask, dim=-1).mean().item()
    controller.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}

"""``python -m rl_multimodal.vla.run CONFIG.yaml [key=value ...]``: train a VLA policy.

The YAML has three sections (see ``examples/grpo_vla_reach.yaml``):

* ``env``: ``name`` (``reach``, ``pusht``, ``metaworld``), ``num_workers`` (env processes;
  >= 2 pipelines env and policy), ``options`` (passed to the task's builder);
* ``policy``: ``model`` (a directory or ``tiny-random-vlm:qwen2_5_vl``), ``head``, ``n_bins``;
* ``trainer``: the fields of `VLATrainerConfig` (``val_seeds`` also as ``{start, count}``),
  plus ``torch_threads``.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

from rl_multimodal.vla.envs.workers import EnvWorkerPool
from rl_multimodal.vla.policy import VLAPolicy, VLAPolicyConfig
from rl_multimodal.vla.trainer import VLATrainer, VLATrainerConfig

__all__ = ["build_env_factory", "main", "resolve_model"]


def build_env_factory(name: str, options: dict[str, Any]) -> Any:
    """A picklable ``factory(num_envs) -> VectorEnv`` for the task `name`."""
    if name == "reach":
        from rl_multimodal.vla.envs.reach import ReachConfig, ReachEnv

        return functools.partial(ReachEnv, config=ReachConfig(**options))
    if name == "pusht":
        from rl_multimodal.vla.envs.sims import make_pusht

        return functools.partial(make_pusht, **options)
    if name == "metaworld":
        from rl_multimodal.vla.envs.sims import make_metaworld

        return functools.partial(make_metaworld, **options)
    raise ValueError(f"env.name is {name!r}, expected one of ['reach', 'pusht', 'metaworld']")


def resolve_model(ref: str) -> str:
    if ref.startswith("tiny-random-vlm:"):
        from rl_multimodal.vlm.tiny import resolve_tiny_vlm

        return resolve_tiny_vlm(ref.split(":", 1)[1])
    return ref


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    import torch
    from omegaconf import OmegaConf

    from rl_core.config import build

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        raise SystemExit("usage: python -m rl_multimodal.vla.run CONFIG.yaml [key=value ...]")
    cfg = OmegaConf.merge(OmegaConf.load(argv[0]), OmegaConf.from_dotlist(argv[1:]))
    raw = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(raw, dict)
    env_cfg, pol_cfg, tr_cfg = dict(raw["env"]), dict(raw["policy"]), dict(raw["trainer"])
    torch.set_num_threads(int(tr_cfg.pop("torch_threads", 1)))
    torch.manual_seed(int(tr_cfg.get("seed", 0)))
    seeds = tr_cfg.get("val_seeds")
    if isinstance(seeds, dict):  # {start: S, count: N} -> S .. S+N-1
        tr_cfg["val_seeds"] = list(
            range(int(seeds["start"]), int(seeds["start"]) + int(seeds["count"]))
        )
    trainer_cfg = build(VLATrainerConfig, tr_cfg, "trainer")
    factory = build_env_factory(env_cfg["name"], dict(env_cfg.get("options", {})))
    workers = int(env_cfg.get("num_workers", 2))
    env = EnvWorkerPool(factory, trainer_cfg.groups * trainer_cfg.n, workers)
    val_env = EnvWorkerPool(factory, len(trainer_cfg.val_seeds), workers)
    try:
        model = resolve_model(str(pol_cfg.pop("model")))
        policy = VLAPolicy.from_pretrained(
            model, env.action_spec, build(VLAPolicyConfig, pol_cfg, "policy")
        )
        history = VLATrainer(policy, env, val_env, trainer_cfg).fit()
    finally:
        env.close()
        val_env.close()
    vals = [h for h in history if "val/success_rate" in h]
    summary = {
        "val/success_rate_before": vals[0]["val/success_rate"],
        "val/success_rate_after": vals[-1]["val/success_rate"],
    }
    print(json.dumps(summary))
    return history


if __name__ == "__main__":
    main()

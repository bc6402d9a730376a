"""Adapters to other libraries' environments, behind the `rl_core.text_env` contract.

Each is an optional extra of rl-rollout and registers a prefix in ``rl.text_envs``:

* ``verifiers:<taskset>`` (`rl_rollout.envs.verifiers`, extra ``verifiers``): a verifiers
  0.4 environment; its model calls come to an endpoint the adapter serves;
* ``openenv:<url>`` (`rl_rollout.envs.openenv`, extra ``openenv``): a client of an OpenEnv
  server;
* ``textarena:<game>`` (`rl_rollout.envs.textarena`, extra ``textarena``): a single-player
  TextArena game.

(``reasoning_gym:<dataset>`` lives in rl-algos, beside the reasoning-gym data source.)
Importing this package imports none of those libraries.
"""

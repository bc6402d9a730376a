"""Rollout-side failover: a replica actor killed while its requests run is dropped or
replaced, its requests go to the replicas left, and the batch is the one an intact pool
gives (every row once: no sample lost or generated twice). A replacement serves only after
a weight sync reached it. A remote server that goes away is dropped."""

from __future__ import annotations

import threading

import pytest
import torch
from rollout_test_utils import HashPolicy, ScriptedRolloutEngine

from rl_core.protocol import DataProto
from rl_core.rollout import RolloutConfig, SamplingParams
from rl_rollout.agent_loop import AgentLoopConfig
from rl_rollout.manager import RolloutManager, RolloutManagerConfig, RolloutReplicaError
from rl_rollout.manager_failover import replica_lost

pytestmark = pytest.mark.ray
IM_END = 2
ROWS = 24


@pytest.fixture(scope="module", autouse=True)
def ray_runtime():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def config(placement: str, mode: str, delay_s: float = 0.4) -> RolloutManagerConfig:
    rollout = RolloutConfig(
        model_path="scripted", engine_kwargs={"policy": HashPolicy(), "delay_s": delay_s}
    )
    return RolloutManagerConfig(
        rollout=rollout,
        num_replicas=2,
        placement=placement,
        num_cpus_per_replica=0.5,
        loop=AgentLoopConfig(response_length=16),
        sampling=SamplingParams(max_tokens=8, stop_token_ids=(IM_END,)),
        request_timeout_s=60,
        on_replica_loss=mode,
    )


def batch(offset: int = 0) -> DataProto:
    prompts = [[offset + i + 3, offset + 2 * i + 5] for i in range(ROWS)]
    uids = [f"u{offset + i}" for i in range(ROWS)]
    return DataProto.from_dict(non_tensors={"raw_prompt_ids": prompts, "uid": uids})


def expected(offset: int = 0) -> DataProto:
    with RolloutManager(config("colocated", "fail", 0.0), None, ScriptedRolloutEngine) as local:
        return local.generate_sequences(batch(offset))


def same(out: DataProto, ref: DataProto) -> None:
    assert out.non_tensor_batch["uid"].tolist() == ref.non_tensor_batch["uid"].tolist()
    for key in ("prompts", "responses", "response_mask", "rollout_log_probs"):
        assert torch.equal(out.batch[key], ref.batch[key]), key


def _kill_soon(actor) -> None:
    import ray

    threading.Timer(0.2, ray.kill, (actor,)).start()


@pytest.mark.parametrize("mode", ["drop", "replace"])
def test_a_killed_replica_is_dropped_or_replaced_and_no_sample_is_lost(mode):
    ref, ref_next = expected(0), expected(100)
    with RolloutManager(config("split", mode), None, ScriptedRolloutEngine) as manager:
        victim = manager.replicas[1]
        _kill_soon(victim.actor)
        out = manager.generate_sequences(batch(0))  # requests on replica 1 go again
        same(out, ref)  # ROWS rows, each once, as from an intact pool
        failover = manager.failover
        assert failover.lost == 1 and failover.reissued >= 1
        metrics = out.meta_info["rollout_metrics"]
        assert metrics["rollout/replicas_lost"] == 1
        assert metrics["rollout/requests_reissued"] == failover.reissued
        before = manager.replica_request_counts()
        if mode == "drop":
            assert manager.balancer.serving == [True, False]
            assert len(manager.weight_receivers()) == 1  # the pool shrank
        else:
            assert manager.replicas[1] is not victim and failover.replaced == 1
            # no sync yet: it loaded the weights the pool serves, so it serves at once
            assert manager.balancer.serving == [True, True]
            assert manager.replicas[1].info["pid"] != victim.info["pid"]
        same(manager.generate_sequences(batch(100)), ref_next)
        counts = [a - b for a, b in zip(manager.replica_request_counts(), before)]
        if mode == "drop":
            assert counts == [ROWS, 0]
        else:
            assert counts[1] > 0  # the replacement serves


def test_a_replacement_serves_only_after_the_next_weight_sync():
    ref = expected(0)
    with RolloutManager(config("split", "replace"), None, ScriptedRolloutEngine) as manager:
        manager.update_weights([[("w", torch.zeros(2))]], version=1)  # the pool is at v1
        victim = manager.replicas[1]
        _kill_soon(victim.actor)
        same(manager.generate_sequences(batch(0)), ref)
        assert manager.failover.waiting_for_weights == {1}
        assert manager.balancer.serving == [True, False]  # it holds v0 weights: not yet
        before = manager.replica_request_counts()
        manager.generate_sequences(batch(100))
        counts = [a - b for a, b in zip(manager.replica_request_counts(), before)]
        assert counts == [ROWS, 0]
        assert len(manager.weight_receivers()) == 2  # it takes the next sync
        manager.update_weights([[("w", torch.ones(2))]], version=2)
        assert manager.balancer.serving == [True, True] and not manager.failover.waiting_for_weights
        before = manager.replica_request_counts()
        manager.generate_sequences(batch(200))
        assert manager.replica_request_counts()[1] > before[1]


def _buckets_killing(actor, count: int = 4):
    """Weight buckets; after the first one, `actor`'s process is killed (mid-sync)."""
    import ray

    for i in range(count):
        yield [("w", torch.full((2,), float(i)))]
        if i == 0:
            ray.kill(actor)


@pytest.mark.parametrize("mode", ["drop", "replace", "fail"])
def test_a_replica_killed_during_a_weight_sync(mode):
    from rl_rollout.weight_sync import WeightSyncError

    ref = expected(0)
    with RolloutManager(config("split", mode), None, ScriptedRolloutEngine) as manager:
        victim = manager.replicas[1]
        if mode == "fail":
            with pytest.raises(
                WeightSyncError, match=r"failed on rollout receiver rank 1 .*ActorDiedError"
            ):
                manager.update_weights(_buckets_killing(victim.actor), version=1)
            return
        stats = manager.update_weights(_buckets_killing(victim.actor), version=1)
        assert stats.lost == (1,) and stats.buckets == 4  # the others got every bucket
        assert manager.policy_version == 1
        # the loss is handled at the replica's next request: every row once
        same(manager.generate_sequences(batch(0)), ref)
        assert manager.failover.lost == 1
        if mode == "drop":
            assert manager.balancer.serving == [True, False]
        else:  # the replacement waits for weights v2 before it serves
            assert manager.replicas[1] is not victim and manager.failover.waiting_for_weights == {1}
            manager.update_weights([[("w", torch.ones(2))]], version=2)
            assert manager.balancer.serving == [True, True]


def test_a_sync_that_loses_every_receiver_fails():
    import ray

    from rl_rollout.weight_sync import WeightSyncError

    with RolloutManager(config("split", "drop"), None, ScriptedRolloutEngine) as manager:
        for replica in manager.replicas:
            ray.kill(replica.actor)
        with pytest.raises(WeightSyncError, match="every rollout receiver was lost"):
            manager.update_weights([[("w", torch.zeros(2))]], version=1)


def test_with_on_replica_loss_fail_a_dead_replica_still_fails_loudly():
    with RolloutManager(config("split", "fail"), None, ScriptedRolloutEngine) as manager:
        _kill_soon(manager.replicas[1].actor)
        with pytest.raises(
            RolloutReplicaError, match=r"rollout replica 1 .* failed during request"
        ):
            manager.generate_sequences(batch(0))


def test_an_engine_error_or_time_out_is_not_a_lost_replica():
    assert not replica_lost(RolloutReplicaError("engine raised ValueError"))
    assert not replica_lost(TimeoutError("slow"))
    inner = type("ActorDiedError", (RuntimeError,), {})("gone")
    outer = RolloutReplicaError("replica 1 failed")
    outer.__cause__ = inner
    assert replica_lost(outer)

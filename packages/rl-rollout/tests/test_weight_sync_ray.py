"""Weight sync to a split rollout pool: two Ray replica actors, each with a real hf engine,
fed by `push_weights` (the manager's ``mode="ray"`` path): one engine session per sync."""

from __future__ import annotations

import time

import pytest
import torch

from rl_core.engine import iter_layer_buckets
from rl_core.rollout import RolloutConfig, SamplingParams
from rl_rollout.weight_sync import WeightSyncError, push_weights

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def ray_runtime():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def _engine_factory():
    """An hf engine that counts its update sessions and can be made slow or failing
    (defined in a function so Ray pickles it by value into the replica actors)."""
    from rl_rollout.backends.hf_engine import HFRolloutEngine

    class ProbedEngine(HFRolloutEngine):
        sessions = 0
        delay_s = 0.0
        fail = False

        def configure(self, delay_s: float = 0.0, fail: bool = False) -> None:
            self.delay_s, self.fail = delay_s, fail

        async def update_weights(self, weights, version=None):
            import asyncio

            self.sessions += 1
            await asyncio.sleep(self.delay_s)
            if self.fail:
                raise RuntimeError("disk full on this rollout worker")
            await super().update_weights(weights, version)

        def state(self):
            return {k: v.clone() for k, v in self.model.state_dict().items()}, self.sessions

    return ProbedEngine


@pytest.fixture(scope="module")
def manager(tiny_model_path):
    from rl_rollout.manager import RolloutManager, RolloutManagerConfig

    config = RolloutManagerConfig(
        rollout=RolloutConfig(model_path=tiny_model_path, max_model_len=64),
        num_replicas=2,
        mode="ray",
        num_cpus_per_replica=0.5,
        sampling=SamplingParams(temperature=0, max_tokens=4),
        request_timeout_s=120,
    )
    manager = RolloutManager(config, engine_factory=_engine_factory())
    yield manager
    manager.shutdown()


@pytest.fixture
def configure(manager):
    def apply(*settings):
        for replica, kwargs in zip(manager.replicas, settings):
            manager._thread.run(replica.call("configure", timeout_s=30, **kwargs), 60)

    yield apply
    apply({}, {})


def _exported(model_path: str, seed: int) -> dict[str, torch.Tensor]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_path)
    g = torch.Generator().manual_seed(seed)
    return {k: v.detach() + torch.randn(v.shape, generator=g) for k, v in model.named_parameters()}


def _states(manager):
    return manager.call_engines("state", timeout_s=60)


def test_bucketed_push_is_one_session_per_replica_and_exact(tiny_model_path, manager, configure):
    configure({}, {})
    exported = _exported(tiny_model_path, seed=1)
    total = sum(t.numel() * t.element_size() for t in exported.values())
    before = [sessions for _, sessions in _states(manager)]
    buckets = iter_layer_buckets(iter(exported.items()), bucket_bytes=64 * 1024)
    stats = manager.update_weights(buckets, version=5)
    assert stats.tensors == len(exported) and stats.bytes == total
    assert stats.buckets > 2  # really bucketed (tiny model: ~0.4 MB in 64 KiB buckets)
    for (state, sessions), earlier in zip(_states(manager), before):
        assert sessions == earlier + 1  # one engine session, however many buckets
        for name, tensor in exported.items():
            assert torch.equal(state[name], tensor), name
    from rl_core.protocol import DataProto

    out = manager.generate_sequences(
        DataProto.from_dict(non_tensors={"raw_prompt_ids": [[5, 6], [7], [8, 9], [3]]})
    )
    assert out.batch["policy_version"].tolist() == [5, 5, 5, 5]
    assert sorted(manager.replica_request_counts()) != [0, 4]  # both replicas served
    # bf16 weights travel as raw bytes too (the fp32 engine upcasts them exactly)
    bf16 = {k: v.to(torch.bfloat16) for k, v in _exported(tiny_model_path, seed=4).items()}
    push_weights(iter_layer_buckets(iter(bf16.items())), manager.weight_receivers(), timeout_s=120)
    state, _ = _states(manager)[1]
    for name, tensor in bf16.items():
        assert torch.equal(state[name], tensor.float()), name


def test_a_slow_receiver_times_out_naming_its_rank(tiny_model_path, manager, configure):
    configure({}, {"delay_s": 30.0})
    start = time.perf_counter()
    with pytest.raises(WeightSyncError, match=r"timed out after 2\.0s on rollout receiver rank 1"):
        push_weights(
            iter_layer_buckets(iter(_exported(tiny_model_path, 2).items()), 64 * 1024),
            manager.weight_receivers(),
            timeout_s=2.0,
        )
    assert time.perf_counter() - start < 20


def test_a_failing_receiver_names_rank_and_cause(tiny_model_path, manager, configure):
    configure({"fail": True}, {})
    with pytest.raises(
        WeightSyncError, match=r"rollout receiver rank 0 .*RuntimeError: disk full on this rollout"
    ):
        push_weights(
            iter_layer_buckets(iter(_exported(tiny_model_path, 3).items())),
            manager.weight_receivers(),
            timeout_s=60,
        )
    with pytest.raises(ValueError, match="receivers is empty"):
        push_weights(iter([]), [], timeout_s=1)

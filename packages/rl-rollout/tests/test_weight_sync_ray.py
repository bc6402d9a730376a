"""Weight sync to separate rollout workers: two Ray actors, each with a real hf engine."""

from __future__ import annotations

import os
import time

import pytest
import torch

from rl_rollout.weight_sync import WeightSyncError, push_weights

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def ray_runtime():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def receivers(tiny_model_path):
    """Two rollout workers: async actors holding an hf engine, loading buckets from the store."""
    import ray

    @ray.remote(num_cpus=0.5)
    class Receiver:
        def __init__(self, model_path: str):
            from rl_core.rollout import RolloutConfig
            from rl_rollout.backends.hf_engine import HFRolloutEngine

            self.engine = HFRolloutEngine(RolloutConfig(model_path=model_path))
            self.delay_s, self.fail, self.buckets = 0.0, False, 0

        def configure(self, delay_s: float = 0.0, fail: bool = False) -> None:
            self.delay_s, self.fail, self.buckets = delay_s, fail, 0

        async def receive_weight_bucket(self, bucket):
            import asyncio

            from rl_rollout.weight_sync import receive_weight_bucket

            await asyncio.sleep(self.delay_s)
            if self.fail:
                raise RuntimeError("disk full on this rollout worker")
            self.buckets += 1
            return await receive_weight_bucket(self.engine, bucket)

        def state(self):
            return {k: v.clone() for k, v in self.engine.model.state_dict().items()}, self.buckets

    actors = [Receiver.remote(tiny_model_path) for _ in range(2)]
    ray.get([a.state.remote() for a in actors], timeout=300)  # started before anything is timed
    yield actors
    for actor in actors:
        ray.kill(actor)


@pytest.fixture
def configure(receivers):
    import ray

    def apply(*settings):
        ray.get([a.configure.remote(**kw) for a, kw in zip(receivers, settings)])

    yield apply
    apply({}, {})


def _exported(model_path: str, seed: int) -> dict[str, torch.Tensor]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_path)
    g = torch.Generator().manual_seed(seed)
    return {k: v.detach() + torch.randn(v.shape, generator=g) for k, v in model.named_parameters()}


def test_bucketed_push_reaches_every_actor_exactly(tiny_model_path, receivers, configure):
    import ray

    configure({}, {})
    exported = _exported(tiny_model_path, seed=1)
    total = sum(t.numel() * t.element_size() for t in exported.values())
    stats = push_weights(iter(exported.items()), receivers, bucket_bytes=64 * 1024, timeout_s=120)
    assert stats.tensors == len(exported) and stats.bytes == total
    assert stats.buckets > 2  # really bucketed (tiny model: ~0.4 MB in 64 KiB buckets)
    for receiver in receivers:
        state, buckets = ray.get(receiver.state.remote())
        assert buckets == stats.buckets
        for name, tensor in exported.items():
            assert torch.equal(state[name], tensor), name
    # bf16 weights travel as raw bytes too (the fp32 engine upcasts them exactly)
    bf16 = {k: v.to(torch.bfloat16) for k, v in _exported(tiny_model_path, seed=4).items()}
    push_weights(iter(bf16.items()), receivers, timeout_s=120)
    state, _ = ray.get(receivers[1].state.remote())
    for name, tensor in bf16.items():
        assert torch.equal(state[name], tensor.float()), name


def test_a_slow_receiver_times_out_naming_its_rank(tiny_model_path, receivers, configure):
    configure({}, {"delay_s": 30.0})
    start = time.perf_counter()
    with pytest.raises(WeightSyncError, match=r"timed out after 2\.0s on rollout receiver rank 1"):
        push_weights(iter(_exported(tiny_model_path, 2).items()), receivers, timeout_s=2.0)
    assert time.perf_counter() - start < 20


def test_a_failing_receiver_names_rank_and_cause(tiny_model_path, receivers, configure):
    configure({"fail": True}, {})
    with pytest.raises(
        WeightSyncError, match=r"rollout receiver rank 0 .*RuntimeError: disk full on this rollout"
    ):
        push_weights(iter(_exported(tiny_model_path, 3).items()), receivers, timeout_s=60)
    with pytest.raises(ValueError, match="receivers is empty"):
        push_weights(iter([]), [], timeout_s=1)

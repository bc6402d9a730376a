"""Weight sync to a split rollout pool: two Ray replica actors, each with a real hf engine,
fed by `push_weights` (the manager's ``placement="split"`` path): one engine session per sync."""

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
        placement="split",
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


def _recording_receiver():
    import ray

    @ray.remote(num_cpus=0)
    class Receiver:
        """The replica actor's ``call(method, *args)`` as the NCCL sender drives it;
        records the protocol (the engines' NCCL calls need GPUs)."""

        def __init__(self, fail_on_bucket: int | None = None) -> None:
            self.calls: list[tuple] = []
            self.fail_on_bucket = fail_on_bucket

        def call(self, method: str, *args):
            self.calls.append((method, *args))
            buckets = sum(c[0] == "receive_nccl_bucket" for c in self.calls)
            if method == "receive_nccl_bucket" and buckets - 1 == self.fail_on_bucket:
                raise RuntimeError("NCCL error: unhandled system error")

        def recorded(self) -> list[tuple]:
            return self.calls

    return Receiver


def _fake_nccl(monkeypatch, backend: str) -> list[list[str]]:
    """Replace only the NCCL endpoint and the broadcast (no GPU here); returns the names
    of each bucket the trainer broadcasts. For vLLM the rest is vLLM 0.32's own trainer
    engine (``trainer_init``, ``send_weights``) driving our client and weight source."""
    from rl_rollout.backends import nccl_transfer

    sent: list[list[str]] = []
    if backend == "vllm":
        from vllm.distributed.weight_transfer import nccl_engine

        def broadcast(self, source, meta):
            sent.append([name for name, _ in self._checked_iter(source, meta)])

        monkeypatch.setattr(nccl_engine, "open_trainer_endpoint", lambda info: "group")
        monkeypatch.setattr(nccl_engine.NCCLTrainerWeightTransferEngine, "_broadcast", broadcast)
    else:
        monkeypatch.setattr(nccl_transfer, "_sglang_group", lambda *args: ("group", args))
        monkeypatch.setattr(
            nccl_transfer,
            "_sglang_broadcast",
            lambda g, bucket: sent.append([n for n, _ in bucket]),
        )
    return sent


def test_nccl_sender_moves_host_buckets_to_its_device(monkeypatch):
    """An engine may export host tensors (megatron does): NCCL refuses them, so the sender
    moves each bucket to its device (the platform's current one by default) first."""
    from rl_rollout.backends import nccl_transfer

    seen: list[tuple[str, str]] = []
    monkeypatch.setattr(
        nccl_transfer,
        "_sglang_broadcast",
        lambda g, bucket: seen.extend((n, t.device.type) for n, t in bucket),
    )
    sender = nccl_transfer.NcclPoolSender([], 1, "sglang", device=torch.device("meta"))
    sender._send(None, nccl_transfer._PoolClient([], 1, 1.0), [("w", torch.ones(2))])
    assert seen == [("w", "meta")]


@pytest.mark.parametrize("backend", [pytest.param("vllm", marks=pytest.mark.vllm), "sglang"])
def test_nccl_sender_runs_one_session_per_sync_over_whole_layer_buckets(monkeypatch, backend):
    """`NcclPoolSender` (GPU path): one group, rank offsets by TP size, then per sync
    begin -> one receive per bucket, in the trainer's bucket order, each while the
    trainer broadcasts it -> finish(version); a failing bucket closes the session without
    a version and names the backend."""
    import ray

    from rl_rollout.backends import nccl_transfer

    sent = _fake_nccl(monkeypatch, backend)
    weights = [(f"model.layers.{i}.{p}", torch.ones(4, 8)) for i in range(3) for p in "qkv"]
    buckets = list(iter_layer_buckets(iter(weights), 2 * 3 * 4 * 8 * 4))  # 2 layers a bucket
    receivers = [_recording_receiver().remote() for _ in range(2)]
    sender = nccl_transfer.NcclPoolSender(receivers, tensor_parallel_size=2, backend=backend)
    stats = sender(iter(buckets), version=7)
    assert stats.buckets == len(buckets) == 2 and stats.tensors == 9
    assert sent == [[n for n, _ in b] for b in buckets]
    for rank, receiver in enumerate(receivers):
        calls = ray.get(receiver.recorded.remote())
        init = ("init_nccl_weight_transfer", sender.master_address, sender.master_port)
        wire = {"packed": True, "packed_buffer_size_bytes": 1024**3, "packed_num_buffers": 2}
        assert calls[0] == (*init, 1 + 2 * rank, 5, *([wire] if backend == "vllm" else []))
        assert [c[0] for c in calls[1:]] == [
            "begin_nccl_update", "receive_nccl_bucket", "receive_nccl_bucket",
            "finish_nccl_update",
        ]  # fmt: skip
        assert calls[2][1:] == (sent[0], ["float32"] * 6, [[4, 8]] * 6)
        assert calls[-1] == ("finish_nccl_update", 7)

    broken = [_recording_receiver().remote(fail_on_bucket=1) for _ in range(2)]
    sender = nccl_transfer.NcclPoolSender(broken, tensor_parallel_size=1, backend=backend)
    with pytest.raises(WeightSyncError, match=rf"\({backend}\) failed: .*bucket 1 .*unhandled"):
        sender(iter(buckets), version=8)
    calls = ray.get(broken[0].recorded.remote())
    assert calls[-1] == ("finish_nccl_update", None)  # closed, the version not advanced


def test_nccl_sender_refuses_a_backend_without_a_receiver():
    from rl_rollout.backends.nccl_transfer import NcclPoolSender

    with pytest.raises(ValueError, match="backend 'hf' has no NCCL weight receiver"):
        NcclPoolSender([], tensor_parallel_size=1, backend="hf")

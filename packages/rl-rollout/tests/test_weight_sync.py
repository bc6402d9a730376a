"""Weight sync building blocks and the colocated path, against the real hf engine."""

import asyncio

import pytest
import torch

from rl_core.rollout import RolloutConfig, SamplingParams
from rl_rollout.backends.hf_engine import HFRolloutEngine
from rl_rollout.backends.weight_files import iter_buckets, read_bucket, write_bucket
from rl_rollout.weight_sync import WeightBucket, WeightSyncError, sync_colocated


def test_bucket_round_trip_keeps_names_dtypes_shapes_and_values():
    g = torch.Generator().manual_seed(0)
    pairs = [
        ("a.weight", torch.randn(3, 5, generator=g)),
        ("b.bias", torch.randn(7, generator=g).to(torch.bfloat16)),
        ("c.scale", torch.tensor(2.5, dtype=torch.float16)),
        ("d.index", torch.arange(6, dtype=torch.int64).reshape(2, 3)),
        ("e.view", torch.randn(4, 4, generator=g).t()),  # non-contiguous input
    ]
    bucket = WeightBucket.pack(pairs)
    assert bucket.nbytes == sum(t.numel() * t.element_size() for _, t in pairs)
    out = list(bucket.tensors())
    assert [n for n, _ in out] == [n for n, _ in pairs]
    for (_, expected), (_, got) in zip(pairs, out):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert torch.equal(got, expected)


def test_buckets_are_size_bounded_and_names_unique():
    pairs = [(f"w{i}", torch.zeros(100)) for i in range(10)]  # 400 bytes each
    sizes = [len(b) for b in iter_buckets(pairs, bucket_bytes=1000)]
    assert sizes == [2, 2, 2, 2, 2]
    assert [len(b) for b in iter_buckets(pairs, bucket_bytes=100)] == [1] * 10  # oversize alone
    with pytest.raises(ValueError, match="'w0' appears twice"):
        list(iter_buckets([("w0", torch.zeros(1)), ("w0", torch.ones(1))], 1000))
    with pytest.raises(TypeError, match=r"\(str, torch.Tensor\) pairs"):
        list(iter_buckets([("w0", [1.0])], 1000))
    with pytest.raises(ValueError, match="bucket_bytes=0"):
        list(iter_buckets(pairs, 0))


def test_bucket_files_round_trip_with_tied_tensors(tmp_path):
    shared = torch.randn(4, 3)
    pairs = [("embed.weight", shared), ("lm_head.weight", shared), ("x", torch.ones(2))]
    path = write_bucket(pairs, directory=str(tmp_path))
    back = dict(read_bucket(path))
    assert torch.equal(back["embed.weight"], shared) and torch.equal(back["lm_head.weight"], shared)
    assert torch.equal(back["x"], torch.ones(2))


@pytest.fixture(scope="module")
def engine_and_model(tiny_model_path):
    import transformers

    engine = HFRolloutEngine(RolloutConfig(model_path=tiny_model_path, max_model_len=128))
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path)
    return engine, model


def test_colocated_sync_loads_exported_weights_exactly(engine_and_model):
    engine, model = engine_and_model
    g = torch.Generator().manual_seed(3)
    exported = {k: v.detach() + 0.1 * torch.randn(v.shape, generator=g)
                for k, v in model.named_parameters()}  # fmt: skip

    async def run():
        stats = await sync_colocated(iter(exported.items()), engine, timeout_s=60)
        out = await engine.generate([5, 6, 7], SamplingParams(temperature=0, max_tokens=6), "r")
        return stats, out

    stats, (out,) = asyncio.run(run())
    assert stats.tensors == len(exported)
    assert stats.bytes == sum(t.numel() * t.element_size() for t in exported.values())
    state = engine.model.state_dict()
    for name, tensor in exported.items():
        assert torch.equal(state[name], tensor), name
    # and the engine computes with them: greedy log-probs equal a forward of the new weights
    model.load_state_dict(exported, strict=False)
    with torch.no_grad():
        logits = model(torch.tensor([[5, 6, 7, *out.token_ids[:-1]]])).logits[0, 2:]
    ref = logits.log_softmax(-1).gather(-1, torch.tensor(out.token_ids)[:, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor(out.log_probs), ref, atol=1e-4, rtol=0)


def test_colocated_sync_times_out_loudly(engine_and_model):
    engine, _ = engine_and_model

    def slow_export():
        import time

        time.sleep(1.0)  # a trainer that stalls while gathering weights
        yield "model.norm.weight", torch.ones(64)

    with pytest.raises(WeightSyncError, match=r"timed out after 0\.2s"):
        asyncio.run(sync_colocated(slow_export(), engine, timeout_s=0.2))


def test_hf_update_rejects_unknown_names_and_wrong_shapes(engine_and_model):
    engine, _ = engine_and_model
    with pytest.raises(KeyError, match=r"'model\.nope' is not a parameter"):
        asyncio.run(engine.update_weights([("model.nope", torch.zeros(1))]))
    with pytest.raises(ValueError, match=r"'model.norm.weight' has shape \(3,\): expected \(64,\)"):
        asyncio.run(engine.update_weights([("model.norm.weight", torch.zeros(3))]))

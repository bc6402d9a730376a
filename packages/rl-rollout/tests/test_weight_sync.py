"""Weight sync building blocks and the colocated path, against the real hf engine."""

import asyncio
import threading

import pytest
import torch

from rl_core.engine import iter_layer_buckets, layer_of
from rl_core.rollout import RolloutConfig, SamplingParams
from rl_rollout.backends.hf_engine import HFRolloutEngine
from rl_rollout.backends.weight_files import (
    WeightFileSpaceError,
    check_free_space,
    read_bucket,
    write_bucket,
)
from rl_rollout.weight_sync import BucketStream, WeightBucket, WeightSyncError, sync_colocated


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
    pairs = [(f"w{i}", torch.zeros(100)) for i in range(10)]  # 400 bytes each, one unit each
    sizes = [len(b) for b in iter_layer_buckets(pairs, bucket_bytes=1000)]
    assert sizes == [2, 2, 2, 2, 2]
    assert [len(b) for b in iter_layer_buckets(pairs, bucket_bytes=100)] == [1] * 10
    with pytest.raises(ValueError, match="'w0' appears twice"):
        list(iter_layer_buckets([("w0", torch.zeros(1)), ("w0", torch.ones(1))], 1000))
    with pytest.raises(TypeError, match=r"\(str, torch.Tensor\) pairs"):
        list(iter_layer_buckets([("w0", [1.0])], 1000))
    with pytest.raises(ValueError, match="bucket_bytes=0"):
        list(iter_layer_buckets(pairs, 0))


def _qwen2_like_export(layers: int = 3, hidden: int = 16) -> list[tuple[str, torch.Tensor]]:
    """A trainer's export in state-dict order: embeddings, per layer q/k/v (fused into qkv by
    vLLM), o, gate/up (fused into gate_up), down, norms; final norm and head."""
    pairs = [("model.embed_tokens.weight", torch.zeros(32, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            pairs.append((p + f"self_attn.{name}.weight", torch.zeros(hidden, hidden)))
        for name in ("gate_proj", "up_proj", "down_proj"):
            pairs.append((p + f"mlp.{name}.weight", torch.zeros(hidden, hidden)))
        pairs.append((p + "input_layernorm.weight", torch.zeros(hidden)))
    pairs += [
        ("model.norm.weight", torch.zeros(hidden)),
        ("lm_head.weight", torch.zeros(32, hidden)),
    ]
    return pairs


@pytest.mark.parametrize("limit", [1, 1024, 4 * 1024, 3 * 8 * 1024])
def test_no_layer_or_fused_parameter_is_ever_split_across_buckets(limit):
    # one layer is 7 * 16 * 16 * 4 + 64 = 7232 bytes: limits of 1 B and 1-4 KiB are smaller
    pairs = _qwen2_like_export()
    buckets = list(iter_layer_buckets(iter(pairs), bucket_bytes=limit))
    assert [n for b in buckets for n, _ in b] == [n for n, _ in pairs]  # order and completeness
    home = {}
    for index, bucket in enumerate(buckets):
        for name, _ in bucket:
            home.setdefault(layer_of(name), set()).add(index)
    assert all(len(v) == 1 for v in home.values()), home  # every layer in exactly one bucket
    for i in range(3):  # the fused groups in particular, computed independently of layer_of
        for group in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
            places = {
                index
                for index, bucket in enumerate(buckets)
                for name, _ in bucket
                if name.startswith(f"model.layers.{i}.") and name.split(".")[-2] in group
            }
            assert len(places) == 1, (limit, i, group, places)
    layer_bytes = 7 * 16 * 16 * 4 + 16 * 4
    for bucket in buckets:  # bounded: the limit, or one indivisible layer alone
        size = sum(t.numel() * t.element_size() for _, t in bucket)
        assert size <= max(limit, layer_bytes)
    if limit == 3 * 8 * 1024:  # 24 KiB: three 7 KiB layers fit, the embeddings join them
        assert len(buckets) == 2


def test_layer_of_names_the_layer_prefix():
    assert layer_of("model.layers.12.self_attn.q_proj.weight") == "model.layers.12"
    assert layer_of("transformer.h.0.attn.c_attn.weight") == "transformer.h.0"
    assert layer_of("model.embed_tokens.weight") == "model.embed_tokens.weight"


def test_free_space_check_names_directory_need_and_fix(tmp_path):
    check_free_space(str(tmp_path), 1024)  # plenty here
    import shutil

    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(WeightFileSpaceError, match=r"MiB free, a weight bucket needs .*shm-size"):
        check_free_space(str(tmp_path), free + 1)


def test_bucket_stream_is_bounded_and_reports_a_stalled_or_failed_sender():
    stream = BucketStream(max_buckets=1, timeout_s=0.3)
    stream.put([("a", torch.zeros(2))])
    with pytest.raises(WeightSyncError, match=r"took no bucket for 0\.3s"):
        stream.put([("b", torch.zeros(2))])  # nobody consumes: bounded, then loud
    consumer = BucketStream(max_buckets=2, timeout_s=0.3)
    with pytest.raises(WeightSyncError, match=r"no bucket arrived for 0\.3s"):
        list(consumer)
    failing = BucketStream(max_buckets=2, timeout_s=5)
    failing.put([("a", torch.zeros(2))])
    failing.fail(RuntimeError("gather failed on rank 1"))
    with pytest.raises(WeightSyncError, match="gather failed on rank 1"):
        list(failing)


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


def test_partial_rollout_resumes_with_new_weights_and_records_per_token_versions(
    tiny_model_path,
):
    """A request in flight at a weight update continues with the new weights: its tokens so
    far keep version 0 and their log-probs under the old weights; every later token has the
    new version and is the greedy token (with the log-prob) of the new weights on the whole
    context, i.e. the KV cache was recomputed."""
    import transformers

    engine = HFRolloutEngine(RolloutConfig(model_path=tiny_model_path, max_model_len=128))
    old = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    new = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g))
    weights = list(new.state_dict().items())
    prompt = [5, 6, 7]

    async def run():
        task = asyncio.ensure_future(
            engine.generate(prompt, SamplingParams(temperature=0, max_tokens=100), "long")
        )

        def generated() -> int:
            request = getattr(engine, "_requests", {}).get("long")
            return len(request.seqs[0].tokens) if request else 0

        while generated() < 3:  # in flight, mid-way
            await asyncio.sleep(0.001)
        await engine.update_weights(iter(weights), version=7)
        return await task

    (out,) = asyncio.run(run())
    versions = out.weight_versions
    switch = versions.index(7)
    assert 3 <= switch < len(versions) - 1, versions
    assert versions == [0] * switch + [7] * (len(versions) - switch)
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        ref_old = old(ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
        ref_new = new(ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
    tokens = torch.tensor(out.token_ids)
    got = torch.tensor(out.log_probs)
    expected = torch.where(
        torch.tensor(versions) == 7,
        ref_new.gather(-1, tokens[:, None]).squeeze(-1),
        ref_old.gather(-1, tokens[:, None]).squeeze(-1),
    )
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert torch.equal(tokens[switch:], ref_new[switch:].argmax(-1))  # greedy under new weights
    asyncio.run(engine.shutdown())


def test_manager_sync_is_one_engine_session_however_many_buckets(tiny_model_path):
    """The colocated manager streams many whole-layer buckets into ONE engine update call
    and records the policy version on the tokens generated afterwards."""
    from rl_rollout.manager import RolloutManager, RolloutManagerConfig

    calls = []

    class CountingEngine(HFRolloutEngine):
        async def update_weights(self, weights, version=None):
            calls.append(version)
            await super().update_weights(weights, version)

    config = RolloutManagerConfig(
        rollout=RolloutConfig(model_path=tiny_model_path, max_model_len=64),
        placement="colocated",
        sampling=SamplingParams(temperature=0, max_tokens=4),
    )
    manager = RolloutManager(config, engine_factory=CountingEngine)
    try:
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path)
        pairs = [(k, v + 0.01) for k, v in model.state_dict().items()]
        producer = threading.get_ident()
        seen_threads = set()

        def export():  # the trainer's side: buckets produced in the caller's thread
            for bucket in iter_layer_buckets(pairs, bucket_bytes=1):
                seen_threads.add(threading.get_ident())
                yield bucket

        stats = manager.update_weights(export(), version=3)
        assert calls == [3] and seen_threads == {producer}
        assert stats.tensors == len(pairs) and stats.buckets > 3
        engine = manager.replicas[0].host.engine
        for name, tensor in pairs:
            assert torch.equal(engine.model.state_dict()[name], tensor), name
        from rl_core.protocol import DataProto

        out = manager.generate_sequences(
            DataProto.from_dict(non_tensors={"raw_prompt_ids": [[5, 6], [7]]})
        )
        versions = out.batch["rollout_weight_versions"]
        mask = out.batch["response_mask"].bool()
        assert (versions[mask] == 3).all() and (versions[~mask] == -1).all()
        assert out.batch["policy_version"].tolist() == [3, 3]
        assert manager.policy_version == 3
    finally:
        manager.shutdown()

"""hf engine specifics: batching, left padding, sleep aborts, event loops, config errors."""

import asyncio

import pytest
import torch

from rl_core.rollout import RolloutConfig, SamplingParams
from rl_rollout.backends.hf_engine import HFRolloutEngine


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    return HFRolloutEngine(RolloutConfig(model_path=tiny_model_path, max_model_len=256))


class _ForwardCounter:
    """Wraps the engine's model to record the batch shape of every forward."""

    def __init__(self, engine):
        self.engine, self.shapes = engine, []
        self.model = engine.model

    def __enter__(self):
        model, shapes = self.model, self.shapes

        def counted(*args, **kwargs):
            shapes.append(tuple(kwargs["input_ids"].shape))
            return model(*args, **kwargs)

        self.engine.model = counted
        return self

    def __exit__(self, *exc):
        self.engine.model = self.model


def test_concurrent_requests_share_one_batch_and_match_solo_runs(engine):
    prompts = [[5, 6, 7], [8] * 11, [9, 10, 11, 12, 13, 14]]
    greedy = SamplingParams(temperature=0.0, max_tokens=6)

    async def together():
        return await asyncio.gather(
            *(engine.generate(p, greedy, f"t{i}") for i, p in enumerate(prompts))
        )

    with _ForwardCounter(engine) as counter:
        batched = asyncio.run(together())
    assert counter.shapes[0] == (3, 11)  # one prefill: 3 rows left-padded to the longest
    assert len(counter.shapes) == 6  # then one decode step per token for the whole batch
    for i, prompt in enumerate(prompts):
        (solo,) = asyncio.run(engine.generate(prompt, greedy, f"s{i}"))
        assert batched[i][0].token_ids == solo.token_ids  # left padding changes nothing
        torch.testing.assert_close(batched[i][0].log_probs, solo.log_probs, atol=1e-5, rtol=0)


def _teacher_forced(model, prompt, tokens):
    ids = torch.tensor([prompt + list(tokens)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]


def test_samples_of_a_request_are_prefilled_once_with_their_own_cache_rows(engine):
    """n samples share one prefill row; every sample's log-probs still equal a
    teacher-forced forward of its own prompt + tokens (a cache row copied to the wrong
    sample, or not copied, would change them)."""
    prompts = [[5, 6, 7, 8, 9], [3, 4]]
    params = [SamplingParams(n=4, max_tokens=5, seed=1), SamplingParams(n=2, max_tokens=5, seed=2)]

    async def together():
        return await asyncio.gather(
            *(engine.generate(p, sp, f"g{i}") for i, (p, sp) in enumerate(zip(prompts, params)))
        )

    with _ForwardCounter(engine) as counter:
        results = asyncio.run(together())
    assert counter.shapes[0] == (2, 5)  # one prefill row per distinct prompt, not 6
    assert len({tuple(o.token_ids) for o in results[0]}) > 1  # the samples differ
    for prompt, outputs in zip(prompts, results):
        for out in outputs:
            want = _teacher_forced(engine.model, prompt, out.token_ids)
            torch.testing.assert_close(torch.as_tensor(out.log_probs), want, atol=1e-4, rtol=0)


def test_a_prefix_common_to_all_prompts_runs_once(engine):
    """Prompts that share 20 tokens (a system prompt, fixed demos): the prefix runs once at
    batch size 1, the rest left-padded after it; greedy tokens equal solo runs and sampled
    log-probs equal teacher-forced forwards."""
    shared = [(7 * i) % 50 + 3 for i in range(20)]
    prompts = [[*shared, 9, 10, 11], [*shared, 12], [*shared, 13, 14]]
    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    sampled = SamplingParams(n=2, max_tokens=4, seed=5)

    async def together(params):
        return await asyncio.gather(
            *(engine.generate(p, params, f"p{i}") for i, p in enumerate(prompts))
        )

    with _ForwardCounter(engine) as counter:
        batched = asyncio.run(together(greedy))
    assert counter.shapes[:2] == [(1, 20), (3, 3)]  # the prefix, then each prompt's rest
    for i, prompt in enumerate(prompts):
        (solo,) = asyncio.run(engine.generate(prompt, greedy, f"s{i}"))
        assert batched[i][0].token_ids == solo.token_ids
        torch.testing.assert_close(batched[i][0].log_probs, solo.log_probs, atol=1e-5, rtol=0)
    for prompt, outputs in zip(prompts, asyncio.run(together(sampled))):
        for out in outputs:
            want = _teacher_forced(engine.model, prompt, out.token_ids)
            torch.testing.assert_close(torch.as_tensor(out.log_probs), want, atol=1e-4, rtol=0)


def test_finished_rows_leave_the_batch(engine):
    async def run():
        return await asyncio.gather(
            engine.generate([5, 6], SamplingParams(max_tokens=2, seed=0), "short"),
            engine.generate([5, 6], SamplingParams(max_tokens=8, seed=1), "long"),
        )

    with _ForwardCounter(engine) as counter:
        short, long = asyncio.run(run())
    assert len(short[0].token_ids) == 2 and len(long[0].token_ids) == 8
    # the equal prompts share one prefill row; both decode, then the short one leaves
    assert [s[0] for s in counter.shapes] == [1, 2, 1, 1, 1, 1, 1, 1]


def test_sleep_aborts_in_flight_requests_and_wake_up_resumes(engine):
    async def run():
        task = asyncio.create_task(
            engine.generate([5, 6, 7], SamplingParams(max_tokens=240, seed=0), "sleepy")
        )
        await asyncio.sleep(0.05)
        await engine.sleep(level=1)
        (aborted,) = await asyncio.wait_for(task, 30)
        await engine.wake_up()
        (after,) = await engine.generate([5, 6, 7], SamplingParams(max_tokens=3), "awake")
        return aborted, after

    aborted, after = asyncio.run(run())
    assert aborted.finish_reason == "abort" and len(aborted.token_ids) < 240
    assert len(after.token_ids) == 3 and after.finish_reason == "length"
    with pytest.raises(ValueError, match="sleep level=3"):
        asyncio.run(engine.sleep(level=3))


def test_abort_of_a_queued_request_returns_no_tokens(engine):
    async def run():
        # the batch window is 5 ms: abort before the scheduler picks the request up
        task = asyncio.create_task(engine.generate([5], SamplingParams(n=2, max_tokens=4), "q"))
        await asyncio.sleep(0)
        await engine.abort(["q"])
        return await task

    outs = asyncio.run(run())
    assert [(o.token_ids, o.finish_reason) for o in outs] == [([], "abort"), ([], "abort")]


def test_multi_modal_data_is_refused(engine):
    with pytest.raises(ValueError, match="text-only"):
        asyncio.run(engine.generate([5], SamplingParams(), "mm", multi_modal_data={"image": [1]}))


def test_config_errors_name_the_field(tiny_model_path):
    with pytest.raises(ValueError, match="tensor_parallel_size=2 is invalid for the 'hf'"):
        HFRolloutEngine(RolloutConfig(model_path=tiny_model_path, tensor_parallel_size=2))
    with pytest.raises(ValueError, match=r"^engine_kwargs.gpu: unknown key 'gpu'"):
        HFRolloutEngine(RolloutConfig(model_path=tiny_model_path, engine_kwargs={"gpu": 1}))


def test_shutdown_is_idempotent_and_final(tiny_model_path):
    engine = HFRolloutEngine(RolloutConfig(model_path=tiny_model_path))

    async def run():
        await engine.generate([5], SamplingParams(max_tokens=1), "x")
        await engine.shutdown()
        await engine.shutdown()
        with pytest.raises(RuntimeError, match="shut down"):
            await engine.generate([5], SamplingParams(max_tokens=1), "y")

    asyncio.run(run())


def test_bf16_rollout_log_probs_and_weight_sync(tiny_model_path):
    """rollout.dtype=bfloat16: the model runs in bf16; the sampled tokens' log-probs are
    within twice the plain model's own bf16-vs-fp32 gap of an fp32 teacher-forced forward;
    fp32 weights sent by the trainer arrive rounded to bf16."""
    from transformers import AutoModelForCausalLM

    bf16 = HFRolloutEngine(
        RolloutConfig(model_path=tiny_model_path, max_model_len=256, dtype="bfloat16")
    )
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    plain = {
        d: AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=d).eval()
        for d in (torch.float32, torch.bfloat16)
    }
    prompts = [[5, 6, 7, 8, 9], [3, 4], [11] * 7]
    params = SamplingParams(n=2, max_tokens=6, seed=3)

    async def together():
        return await asyncio.gather(
            *(bf16.generate(p, params, f"b{i}") for i, p in enumerate(prompts))
        )

    gap = diff = 0.0
    for prompt, outputs in zip(prompts, asyncio.run(together())):
        for out in outputs:
            fp32 = _teacher_forced(plain[torch.float32], prompt, out.token_ids)
            ref16 = _teacher_forced(plain[torch.bfloat16], prompt, out.token_ids)
            gap = max(gap, float((fp32 - ref16).abs().max()))
            diff = max(diff, float((torch.as_tensor(out.log_probs) - fp32).abs().max()))
    assert gap > 1e-4
    assert 1e-5 < diff <= 2 * gap, (diff, gap)
    name, weight = "model.norm.weight", torch.full((64,), 1.0 + 2**-12)  # below bf16's step
    sent = [(name, weight), ("lm_head.weight", plain[torch.float32].lm_head.weight * 1.001)]
    asyncio.run(bf16.update_weights(iter(sent), version=1))
    state = bf16.model.state_dict()
    for key, tensor in sent:
        assert state[key].dtype == torch.bfloat16
        assert torch.equal(state[key], tensor.bfloat16())
    asyncio.run(bf16.shutdown())

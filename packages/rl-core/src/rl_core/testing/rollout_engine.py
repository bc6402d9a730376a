"""Conformance suite for `rl_core.rollout.RolloutEngine` implementations.

A rollout package runs it against itself by subclassing in its tests::

    from rl_core.testing.rollout_engine import RolloutEngineConformance

    class TestMyEngine(RolloutEngineConformance):
        backend = "my-engine"                 # its name in the rl.rollouts group
        config_overrides = {"engine_kwargs": {...}}

The suite saves a tiny random Hugging Face model (Qwen2 by default) to a temp directory,
builds one engine for the whole class through `build_rollout_engine` (inside one event
loop that runs in a background thread and serves every test), and checks the contract:
n-sample generation, log-probs against a separate float64 Hugging Face forward of the same
tokens, stop tokens, max_tokens and context length, abort, in-place weight updates (a
perturbation changes the outputs, restoring the weights restores them exactly),
sleep/wake-up, prefix-cache reset, seeds, concurrency and clear errors for bad input.
transformers is imported only inside functions: the suite needs it when it runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest
import torch

from rl_core.rollout import (
    GenerationOutput,
    RolloutConfig,
    RolloutEngine,
    SamplingParams,
    build_rollout_engine,
)

__all__ = [
    "AsyncRunner",
    "EngineUnderTest",
    "RolloutEngineConformance",
    "RolloutEngineDeviceConformance",
    "check_rollout_on_standin",
    "reference_log_probs",
    "save_tiny_causal_lm",
    "truncated_log_probs",
]

T = TypeVar("T")
TINY_VOCAB = 512


class AsyncRunner:
    """One event loop in a daemon thread; `run` executes a coroutine there and waits.

    Engines bind background tasks to the loop they first run in, so a test suite keeps one
    loop for an engine's whole life instead of a fresh `asyncio.run` per test.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 300.0) -> T:
        return self.submit(coro).result(timeout=timeout)

    def call(self, fn: Callable[[], T], timeout: float = 600.0) -> T:
        """Call a plain function inside the loop (e.g. an engine constructor)."""

        async def call() -> T:
            return fn()

        return self.run(call(), timeout=timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        if not self.loop.is_running():
            self.loop.close()


def save_tiny_causal_lm(
    path: str | Path, arch: str = "qwen2", seed: int = 0, max_position_embeddings: int = 512
) -> str:
    """Save a tiny random causal LM (vocab 512, hidden 64, 2 layers, 2 heads of 32) and
    return its path.

    Weights are drawn with std 0.2 (instead of 0.02) so next-token distributions are
    peaked: greedy choices are not near-ties and samples differ visibly.
    """
    import transformers

    common = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 32: the smallest vLLM's CPU attention supports
        num_key_value_heads=1,
        max_position_embeddings=max_position_embeddings,
        initializer_range=0.2,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    configs = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig}
    if arch not in configs:
        raise ValueError(f"arch={arch!r} is invalid: expected one of {sorted(configs)}")
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(configs[arch](**common))
    model.save_pretrained(str(path))
    return str(path)


def truncated_log_probs(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """log_softmax over the top-k, then top-p set (float64 reference, written independently)."""
    out = torch.full_like(logits, float("-inf"))
    for row in range(logits.shape[0]):
        values, order = logits[row].sort(descending=True)
        keep = len(values) if top_k < 1 else min(top_k, len(values))
        probs = values[:keep].softmax(-1)
        mass, n = 0.0, 0
        while n < keep and mass < top_p:
            mass += float(probs[n])
            n += 1
        out[row, order[:n]] = values[:n].log_softmax(-1)
    return out


def reference_log_probs(
    model: Any, prompt: list[int], tokens: list[int], temperature: float, top_k=-1, top_p=1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 forward of prompt+tokens: (log-probs of `tokens`, full log-prob rows [R, V])."""
    ids = torch.tensor([prompt + tokens[:-1]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 :].double()
    scaled = logits / temperature if temperature > 0 else logits
    if temperature > 0 and (top_k > 0 or top_p < 1):
        rows = truncated_log_probs(scaled, top_k, top_p)
    else:
        rows = scaled.log_softmax(-1)
    return rows.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1), rows


class EngineUnderTest:
    """The fixtures both rollout conformance suites start from: a tiny model saved by the
    suite's ``save_model(path, arch)`` (``model_arch``), an `AsyncRunner`, and the engine
    ``backend`` on that model, shut down after the class."""

    backend: ClassVar[str]
    model_arch: ClassVar[str]
    save_model: ClassVar[Callable[[Path, str], str]]
    config_overrides: ClassVar[dict[str, Any]] = {}
    """Extra `RolloutConfig` fields for the engine under test."""
    max_model_len: ClassVar[int] = 256
    logprob_atol: ClassVar[float] = 2e-3
    """Tolerance between the engine's log-probs and the float64 Hugging Face reference."""
    engine_start_timeout: ClassVar[float] = 600.0
    request_timeout: ClassVar[float] = 300.0

    @pytest.fixture(scope="class")
    @classmethod
    def model_path(cls, tmp_path_factory) -> str:
        return cls.save_model(tmp_path_factory.mktemp(f"tiny-{cls.model_arch}"), cls.model_arch)

    @pytest.fixture(scope="class")
    @classmethod
    def runner(cls):
        runner = AsyncRunner()
        yield runner
        runner.close()

    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls, model_path, runner):
        if not hasattr(cls, "backend"):
            raise TypeError(f"{cls.__name__} must set backend = '<rl.rollouts name>'")
        config = RolloutConfig(
            model_path=model_path,
            backend=cls.backend,
            max_model_len=cls.max_model_len,
            **cls.config_overrides,
        )
        engine = runner.call(lambda: build_rollout_engine(config), cls.engine_start_timeout)
        yield engine
        runner.run(engine.shutdown(), timeout=120)


class RolloutEngineConformance(EngineUnderTest):
    """Subclass with ``backend = "<name>"`` (a class named ``Test...``)."""

    model_arch: ClassVar[str] = "qwen2"
    save_model = staticmethod(save_tiny_causal_lm)
    records_versions: ClassVar[bool] = True
    """Whether `GenerationOutput.weight_versions` is filled (the policy version per token)."""

    # ------------------------------------------------------------------ fixtures
    @pytest.fixture(scope="class")
    @classmethod
    def hf_model(cls, model_path):
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(model_path)
        return model.double().eval()

    # ------------------------------------------------------------------ helpers
    def generate(self, engine, runner, prompt, params, request_id) -> list[GenerationOutput]:
        return runner.run(engine.generate(prompt, params, request_id), self.request_timeout)

    def gather(self, runner, coros) -> list[Any]:
        async def all_of():
            return await asyncio.gather(*coros)

        return runner.run(all_of(), self.request_timeout)

    @staticmethod
    def prompt(seed: int, length: int) -> list[int]:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(3, TINY_VOCAB, (length,), generator=g).tolist()

    def check_output(self, out: GenerationOutput, max_tokens: int) -> None:
        assert isinstance(out, GenerationOutput)
        assert 1 <= len(out.token_ids) <= max_tokens
        assert len(out.log_probs) == len(out.token_ids)
        assert all(isinstance(t, int) and 0 <= t < TINY_VOCAB for t in out.token_ids)
        assert all(lp <= 1e-4 and lp > float("-inf") for lp in out.log_probs)

    def greedy(self, engine, runner, prompt, request_id, max_tokens=12):
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        return self.generate(engine, runner, prompt, params, request_id)[0]

    # ------------------------------------------------------------------ basics
    def test_is_a_rollout_engine(self, engine):
        assert isinstance(engine, RolloutEngine)
        assert engine.max_model_len == self.max_model_len

    def test_max_tokens_finishes_with_length(self, engine, runner):
        params = SamplingParams(max_tokens=7, seed=1)
        (out,) = self.generate(engine, runner, self.prompt(1, 9), params, "length-1")
        self.check_output(out, 7)
        assert len(out.token_ids) == 7 and out.finish_reason == "length"

    def test_n_samples_differ(self, engine, runner):
        params = SamplingParams(n=4, temperature=1.0, max_tokens=16, seed=3)
        outs = self.generate(engine, runner, self.prompt(2, 6), params, "n-4")
        assert len(outs) == 4
        for out in outs:
            self.check_output(out, 16)
            assert out.finish_reason == "length"
        assert len({tuple(o.token_ids) for o in outs}) > 1

    def test_generation_stops_at_the_context_length(self, engine, runner):
        prompt = self.prompt(3, self.max_model_len - 3)
        params = SamplingParams(max_tokens=50, seed=0)
        (out,) = self.generate(engine, runner, prompt, params, "ctx-1")
        assert len(out.token_ids) == 3 and out.finish_reason == "length"

    # ------------------------------------------------------------------ log-probs
    def test_log_probs_match_reference_forward(self, engine, runner, hf_model):
        prompts = [self.prompt(10 + i, 3 + 5 * i) for i in range(4)]  # different lengths
        params = [SamplingParams(temperature=t, max_tokens=20, seed=i) for i, t in
                  enumerate([1.0, 0.7, 1.3, 0.5])]  # fmt: skip
        outs = self.gather(
            runner,
            [engine.generate(p, sp, f"lp-{i}") for i, (p, sp) in enumerate(zip(prompts, params))],
        )
        for prompt, sp, (out,) in zip(prompts, params, outs):
            ref, _ = reference_log_probs(hf_model, prompt, out.token_ids, sp.temperature)
            got = torch.tensor(out.log_probs, dtype=torch.float64)
            torch.testing.assert_close(got, ref, atol=self.logprob_atol, rtol=0)

    def test_greedy_picks_the_reference_argmax(self, engine, runner, hf_model):
        prompt = self.prompt(20, 11)
        out = self.greedy(engine, runner, prompt, "greedy-ref", max_tokens=16)
        ref, rows = reference_log_probs(hf_model, prompt, out.token_ids, 0.0)
        torch.testing.assert_close(
            torch.tensor(out.log_probs, dtype=torch.float64), ref, atol=self.logprob_atol, rtol=0
        )
        # the chosen token is the reference argmax up to numerical near-ties
        assert bool((ref >= rows.max(-1).values - 10 * self.logprob_atol).all())

    def test_truncated_sampling_reports_the_truncated_distribution(self, engine, runner, hf_model):
        prompt = self.prompt(30, 8)
        params = SamplingParams(n=3, temperature=1.2, top_k=6, top_p=0.8, max_tokens=16, seed=5)
        outs = self.generate(engine, runner, prompt, params, "trunc-1")
        for out in outs:
            ref, _ = reference_log_probs(hf_model, prompt, out.token_ids, 1.2, 6, 0.8)
            assert bool(torch.isfinite(ref).all()), "sampled a token outside top-k/top-p"
            torch.testing.assert_close(
                torch.tensor(out.log_probs, dtype=torch.float64),
                ref,
                atol=self.logprob_atol,
                rtol=0,
            )

    # ------------------------------------------------------------------ stop tokens
    def test_stop_token_ends_generation_and_is_included(self, engine, runner):
        prompt = self.prompt(40, 7)
        free = self.greedy(engine, runner, prompt, "stop-free", max_tokens=16)
        stop = free.token_ids[3]
        first = free.token_ids.index(stop)
        unused = next(t for t in range(3, TINY_VOCAB) if t not in free.token_ids)
        params = SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=[unused, stop])
        (out,) = self.generate(engine, runner, prompt, params, "stop-1")
        assert out.finish_reason == "stop"
        assert out.token_ids == free.token_ids[: first + 1]
        assert out.token_ids[-1] == stop

    def test_stop_tokens_with_sampling(self, engine, runner):
        # a large stop set makes every sample stop early; each ends at its first stop token
        stop = list(range(3, TINY_VOCAB, 3))
        params = SamplingParams(n=4, max_tokens=64, stop_token_ids=stop, seed=11)
        for out in self.generate(engine, runner, self.prompt(41, 5), params, "stop-2"):
            assert out.finish_reason == "stop" and out.token_ids[-1] in stop
            assert not any(t in stop for t in out.token_ids[:-1])

    # ------------------------------------------------------------------ seeds, concurrency
    def test_seed_reproducibility(self, engine, runner):
        prompt = self.prompt(50, 9)
        params = SamplingParams(n=2, max_tokens=24, seed=1234)
        a = self.generate(engine, runner, prompt, params, "seed-a")
        b = self.generate(engine, runner, prompt, params, "seed-b")
        c = self.generate(engine, runner, prompt, SamplingParams(n=2, max_tokens=24, seed=99), "c")
        assert [o.token_ids for o in a] == [o.token_ids for o in b]
        for x, y in zip(a, b):
            torch.testing.assert_close(x.log_probs, y.log_probs, atol=1e-4, rtol=0)
        assert [o.token_ids for o in a] != [o.token_ids for o in c]

    def test_concurrent_requests_with_mixed_parameters(self, engine, runner):
        specs = [
            (self.prompt(60 + i, 2 + (7 * i) % 23), SamplingParams(
                n=1 + i % 3, temperature=(0.0, 0.8, 1.0)[i % 3], max_tokens=4 + (5 * i) % 17,
                top_k=(-1, 20)[i % 2], seed=i))
            for i in range(16)
        ]  # fmt: skip
        outs = self.gather(
            runner, [engine.generate(p, sp, f"mix-{i}") for i, (p, sp) in enumerate(specs)]
        )
        for (_, sp), samples in zip(specs, outs):
            assert len(samples) == sp.n
            for out in samples:
                self.check_output(out, sp.max_tokens)
                assert len(out.token_ids) == sp.max_tokens and out.finish_reason == "length"

    def test_many_long_seeded_prompts_at_once(self, engine, runner):
        # more prompt tokens than one engine step usually takes: prompts get batched/split
        specs = [(self.prompt(200 + i, 180 + i), SamplingParams(max_tokens=6, seed=i))
                 for i in range(24)]  # fmt: skip
        outs = self.gather(
            runner, [engine.generate(p, sp, f"long-{i}") for i, (p, sp) in enumerate(specs)]
        )
        assert [len(o[0].token_ids) for o in outs] == [6] * 24
        (again,) = self.generate(engine, runner, *specs[5], "long-again")
        assert again.token_ids == outs[5][0].token_ids  # seeds hold whatever the batching

    def test_duplicate_in_flight_request_id_is_rejected(self, engine, runner):
        long = SamplingParams(max_tokens=self.max_model_len - 8, seed=0)

        async def both():
            first = asyncio.create_task(engine.generate(self.prompt(70, 4), long, "dup"))
            await asyncio.sleep(0)  # the first request is registered before its first await
            try:
                with pytest.raises(ValueError, match="dup"):
                    await engine.generate(self.prompt(71, 4), long, "dup")
            finally:
                await engine.abort(["dup"])
                await first

        runner.run(both(), self.request_timeout)

    # ------------------------------------------------------------------ abort
    def test_abort_returns_partial_output(self, engine, runner):
        max_tokens = self.max_model_len - 8

        async def abort_midway():
            params = SamplingParams(n=2, max_tokens=max_tokens, seed=0)
            task = asyncio.create_task(engine.generate(self.prompt(80, 4), params, "abort-1"))
            await asyncio.sleep(0.05)
            await engine.abort(["abort-1", "no-such-request"])
            return await asyncio.wait_for(task, 60)

        outs = runner.run(abort_midway(), self.request_timeout)
        assert len(outs) == 2
        for out in outs:
            assert out.finish_reason == "abort"
            assert len(out.token_ids) < max_tokens
            assert len(out.log_probs) == len(out.token_ids)
        # the engine keeps serving after an abort
        (after,) = self.generate(
            engine, runner, self.prompt(81, 4), SamplingParams(max_tokens=3), "a2"
        )
        assert len(after.token_ids) == 3

    # ------------------------------------------------------------------ weights
    def test_update_weights_in_place_changes_and_restores_outputs(
        self, engine, runner, hf_model, model_path
    ):
        import transformers

        prompt = self.prompt(90, 10)
        base = self.greedy(engine, runner, prompt, "w-base", max_tokens=16)
        original = {k: v.detach().float().clone() for k, v in hf_model.named_parameters()}
        g = torch.Generator().manual_seed(7)
        perturbed = {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in original.items()}
        runner.run(engine.update_weights(iter(perturbed.items())), 300)
        changed = self.greedy(engine, runner, prompt, "w-changed", max_tokens=16)
        assert changed.token_ids != base.token_ids or not torch.allclose(
            torch.tensor(changed.log_probs), torch.tensor(base.log_probs), atol=1e-2
        )
        # the engine now computes with exactly the perturbed weights
        other = transformers.AutoModelForCausalLM.from_pretrained(model_path)
        other.load_state_dict(perturbed, strict=False)
        other = other.double().eval()
        ref, _ = reference_log_probs(other, prompt, changed.token_ids, 0.0)
        torch.testing.assert_close(
            torch.tensor(changed.log_probs, dtype=torch.float64),
            ref,
            atol=self.logprob_atol,
            rtol=0,
        )
        runner.run(engine.update_weights(iter(original.items())), 300)
        restored = self.greedy(engine, runner, prompt, "w-restored", max_tokens=16)
        assert restored.token_ids == base.token_ids
        torch.testing.assert_close(restored.log_probs, base.log_probs, atol=1e-5, rtol=0)

    def test_update_weights_during_generation(self, engine, runner, hf_model):
        # requests in flight survive an update; with the same weights they are unaffected
        prompt = self.prompt(95, 6)
        max_tokens = self.max_model_len - 8
        base = self.greedy(engine, runner, prompt, "wg-base", max_tokens=max_tokens)
        same = [(k, v.detach().float().clone()) for k, v in hf_model.named_parameters()]

        async def update_midway():
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
            task = asyncio.create_task(engine.generate(prompt, params, "wg-live"))
            await asyncio.sleep(0.05)
            await engine.update_weights(iter(same))
            return await asyncio.wait_for(task, self.request_timeout)

        (out,) = runner.run(update_midway(), self.request_timeout)
        assert out.finish_reason == "length" and out.token_ids == base.token_ids
        torch.testing.assert_close(out.log_probs, base.log_probs, atol=1e-4, rtol=0)

    def test_update_weights_records_the_policy_version_on_later_tokens(
        self, engine, runner, hf_model
    ):
        same = [(k, v.detach().float().clone()) for k, v in hf_model.named_parameters()]
        runner.run(engine.update_weights(iter(same), version=5), 300)
        out = self.greedy(engine, runner, self.prompt(97, 5), "wv", max_tokens=4)
        if not self.records_versions:
            assert out.weight_versions is None or len(out.weight_versions) == 4
            return
        assert out.weight_versions == [5] * len(out.token_ids)

    def test_update_weights_rejects_unknown_names(self, engine, runner):
        with pytest.raises((KeyError, ValueError), match=r"no\.such\.weight"):
            runner.run(engine.update_weights(iter([("no.such.weight", torch.zeros(2))])), 300)
        (out,) = self.generate(
            engine, runner, self.prompt(91, 4), SamplingParams(max_tokens=2), "u"
        )
        assert len(out.token_ids) == 2

    # ------------------------------------------------------------------ memory
    def test_sleep_and_wake_up_keep_generation_working(self, engine, runner):
        prompt = self.prompt(100, 8)
        before = self.greedy(engine, runner, prompt, "sleep-before")
        runner.run(engine.sleep(level=1))
        runner.run(engine.wake_up())
        after = self.greedy(engine, runner, prompt, "sleep-after")
        assert after.token_ids == before.token_ids
        torch.testing.assert_close(after.log_probs, before.log_probs, atol=1e-5, rtol=0)

    def test_reset_prefix_cache(self, engine, runner):
        prompt = self.prompt(110, 40)
        first = self.greedy(engine, runner, prompt, "prefix-1")
        runner.run(engine.reset_prefix_cache())
        second = self.greedy(engine, runner, prompt, "prefix-2")
        assert first.token_ids == second.token_ids

    # ------------------------------------------------------------------ bad input
    def test_empty_prompt_is_rejected(self, engine, runner):
        with pytest.raises(ValueError, match="prompt_ids is empty"):
            self.generate(engine, runner, [], SamplingParams(max_tokens=2), "bad-empty")

    def test_prompt_longer_than_the_context_is_rejected(self, engine, runner):
        prompt = self.prompt(120, self.max_model_len + 5)
        with pytest.raises(ValueError, match=f"max_model_len={self.max_model_len}"):
            self.generate(engine, runner, prompt, SamplingParams(max_tokens=2), "bad-long")

    def test_token_id_outside_the_vocabulary_is_rejected(self, engine, runner):
        with pytest.raises(ValueError, match=f"token id {TINY_VOCAB}"):
            self.generate(engine, runner, [5, TINY_VOCAB], SamplingParams(max_tokens=2), "bad-id")

    def test_stop_token_outside_the_vocabulary_is_rejected(self, engine, runner):
        params = SamplingParams(max_tokens=2, stop_token_ids=[2, TINY_VOCAB + 7])
        with pytest.raises(ValueError, match=f"stop_token_ids contains {TINY_VOCAB + 7}"):
            self.generate(engine, runner, [5, 6], params, "bad-stop")

    @pytest.mark.parametrize(
        ("field", "value"), [("temperature", -1.0), ("top_p", 0.0), ("top_k", 0), ("n", 0)]
    )
    def test_out_of_range_sampling_values_are_rejected(self, engine, runner, field, value):
        params = SamplingParams(max_tokens=2, **{field: value})
        with pytest.raises(ValueError, match=rf"SamplingParams\.{field}\b"):
            self.generate(engine, runner, [5, 6], params, f"bad-{field}")


# ---- the device contract on a device that is not the host ---------------------------------


def _host_values(outputs: list[GenerationOutput], what: str) -> None:
    """Every value a rollout returns is a host value: ints, floats (no device tensors)."""
    for i, out in enumerate(outputs):
        fields = {"token_ids": out.token_ids, "log_probs": out.log_probs}
        if out.weight_versions is not None:
            fields["weight_versions"] = out.weight_versions
        for name, values in fields.items():
            for j, value in enumerate(values):
                if isinstance(value, torch.Tensor):
                    raise AssertionError(
                        f"{what}: output {i} {name}[{j}] is a tensor on {value.device}: "
                        "everything a rollout returns must be a host value (int / float)"
                    )
                kind = float if name == "log_probs" else int
                assert isinstance(value, kind) and not isinstance(value, bool), (
                    f"{what}: output {i} {name}[{j}]={value!r} is a {type(value).__name__}: "
                    f"expected {kind.__name__}"
                )


def check_rollout_on_standin(spec: dict[str, Any]) -> dict[str, int]:
    """Rank side of `RolloutEngineDeviceConformance` (a spawned process): the engine runs on
    `rl_core.testing.standin`'s device (the platform's), its greedy log-probs equal a float64
    host reference, everything it returns is a host value, and sleep/wake-up keep it
    working."""
    import asyncio
    import os

    import transformers

    from rl_core.platform import get_platform
    from rl_core.testing.standin import DEVICE_TYPE, install

    reference = transformers.AutoModelForCausalLM.from_pretrained(spec["model_path"])
    reference = reference.double().eval()
    install()
    os.environ["RL_PLATFORM"] = DEVICE_TYPE
    platform = get_platform()
    prompt = torch.randint(3, TINY_VOCAB, (6,), generator=torch.Generator().manual_seed(5))
    prompt_ids = prompt.tolist()

    async def run() -> dict[str, int]:
        config = RolloutConfig(
            model_path=spec["model_path"],
            backend=spec["backend"],
            max_model_len=spec["max_model_len"],
            **spec["config_overrides"],
        )
        engine = build_rollout_engine(config)
        try:
            on_device = platform.memory_allocated()
            assert on_device > 0, (
                "nothing on the platform's device after building the engine: expected the "
                "model there"
            )
            greedy = SamplingParams(temperature=0.0, max_tokens=8)
            (out,) = await engine.generate(prompt_ids, greedy, "standin-greedy")
            _host_values([out], "greedy generation")
            ref, _ = reference_log_probs(reference, prompt_ids, out.token_ids, 0.0)
            got = torch.tensor(out.log_probs, dtype=torch.float64)
            assert torch.allclose(got, ref, atol=spec["logprob_atol"]), (got, ref)
            sampled = SamplingParams(temperature=1.0, n=2, max_tokens=6, seed=3)
            outs = await engine.generate(prompt_ids, sampled, "standin-sampled")
            _host_values(outs, "seeded sampling, n=2")
            await engine.sleep()
            asleep = platform.memory_allocated()
            await engine.wake_up()
            (again,) = await engine.generate(prompt_ids, greedy, "standin-after-wake")
            _host_values([again], "generation after sleep/wake_up")
            assert again.token_ids == out.token_ids, (again.token_ids, out.token_ids)
            return {"on_device": on_device, "asleep": asleep}
        finally:
            await engine.shutdown()

    return asyncio.run(run())


class RolloutEngineDeviceConformance:
    """The rollout's device contract on a device that is not the host
    (`rl_core.testing.standin`), so it fails on a CPU machine too: subclass with
    ``backend`` (and ``config_overrides``). The engine runs in a spawned process (the
    stand-in changes process-wide torch state)."""

    backend: ClassVar[str]
    config_overrides: ClassVar[dict[str, Any]] = {}
    max_model_len: ClassVar[int] = 256
    logprob_atol: ClassVar[float] = 1e-4

    def test_rollout_on_standin(self, tmp_path) -> None:
        from rl_core.testing.spawn import SpawnRunner

        spec = {
            "backend": self.backend,
            "config_overrides": dict(self.config_overrides),
            "max_model_len": self.max_model_len,
            "logprob_atol": self.logprob_atol,
            "model_path": save_tiny_causal_lm(tmp_path / "model"),
        }
        with SpawnRunner(1, timeout_s=300.0) as runner:
            (result,) = runner.run(check_rollout_on_standin, spec)
        assert result["on_device"] > 0, result

"""Test helpers of rl-rollout's tests (not shipped in the wheel; ``conftest.py`` puts this
directory on ``sys.path``): a tiny local chat tokenizer and a scripted rollout engine.

Nothing here downloads anything. `build_tiny_tokenizer` trains a byte-level BPE on a few
strings (lossless decode, vocabulary < 512 so it fits `save_tiny_causal_lm` models) and gives
it a ChatML-style chat template with tool support. `ScriptedRolloutEngine` implements the
`RolloutEngine` contract with predetermined outputs: a *policy* maps the prompt ids to the
response ids, and each token's log-prob is `scripted_log_prob` of its absolute position and
id, so tests can check where every log-prob landed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from rl_core.rollout import GenerationOutput, RolloutConfig
from rl_rollout.backends.base import BackendEngine, CheckedRequest

__all__ = [
    "CHAT_TEMPLATE",
    "HashPolicy",
    "ScriptedRolloutEngine",
    "TurnScript",
    "build_tiny_tokenizer",
    "scripted_log_prob",
]

SPECIAL_TOKENS = ["<|pad|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
CHAT_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\nTools:\\n' }}"
    "{%- for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{%- endfor %}"
    "{{ '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
_CORPUS = [
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
    "<|im_start|>user\nWhat is 2 + 3? Use the python tool.<|im_end|>\n",
    "<|im_start|>assistant\nLet me compute it.<|im_end|>\n",
    "<|im_start|>tool\nexit status: 0\nstdout:\n5\n<|im_end|>\n",
    '{"name": "python", "arguments": {"code": "print(2 + 3)"}}',
    '{"type": "function", "function": {"name": "add", "description": "Add two integers.", '
    '"parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}',
    "Error: unknown tool; invalid arguments for tool; malformed tool call: invalid JSON",
    "The answer is 5. Hello world, the quick brown fox jumps over the lazy dog.",
    "def f(x):\n    return x * x\nfor i in range(10):\n    print(f(i))\n",
]


def build_tiny_tokenizer(save_dir: str | Path | None = None, vocab_size: int = 384) -> Any:
    """A `PreTrainedTokenizerFast` (byte-level BPE, ChatML template, eos ``<|im_end|>``=2).

    Special tokens have ids 0..4: ``<|pad|>``, ``<|im_start|>``, ``<|im_end|>``,
    ``<tool_call>``, ``</tool_call>``. Saved to `save_dir` when given.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        additional_special_tokens=SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    if save_dir is not None:
        tokenizer.save_pretrained(str(save_dir))
    return tokenizer


def scripted_log_prob(position: int, token: int) -> float:
    """The log-prob the scripted engine reports for `token` at absolute `position`."""
    return -0.001 - ((position * 31 + token) % 97) / 100.0


@dataclass(frozen=True)
class HashPolicy:
    """Response = a deterministic function of the prompt: ``1 + sum(prompt) % max_len``
    tokens ``(sum(prompt) + i) % vocab`` (never a stop token below ``low``), then ``stop``."""

    vocab_size: int = 512
    max_len: int = 7
    stop: int = 2
    low: int = 8

    def __call__(self, prompt: Sequence[int]) -> list[int]:
        total = sum(prompt)
        span = self.vocab_size - self.low
        body = [self.low + (total + 7 * i) % span for i in range(1 + total % self.max_len)]
        return [*body, self.stop]


@dataclass(frozen=True)
class TurnScript:
    """Multi-turn script: turn k (k = how often `marker` occurs in the prompt, minus one)
    answers ``turns[k]``; the last entry repeats. Several scripts can share one engine:
    the first whose ``key`` is a prefix of the prompt is used, else ``fallback``."""

    scripts: tuple[tuple[tuple[int, ...], tuple[tuple[int, ...], ...]], ...]
    marker: tuple[int, ...]
    fallback: Callable[[list[int]], list[int]] | None = None

    @classmethod
    def single(cls, turns: Iterable[Sequence[int]], marker: Sequence[int]) -> TurnScript:
        return cls((((), tuple(tuple(t) for t in turns)),), tuple(marker))

    def __call__(self, prompt: Sequence[int]) -> list[int]:
        prompt = list(prompt)
        for key, turns in self.scripts:
            if prompt[: len(key)] == list(key):
                m = len(self.marker)
                count = sum(prompt[i : i + m] == list(self.marker) for i in range(len(prompt)))
                return list(turns[min(max(count - 1, 0), len(turns) - 1)])
        if self.fallback is not None:
            return self.fallback(prompt)
        raise ValueError(f"TurnScript: no script for a prompt starting with {prompt[:8]}")


class ScriptedRolloutEngine(BackendEngine):
    """A `RolloutEngine` whose outputs come from ``config.engine_kwargs["policy"]``.

    Honours max_tokens, stop_token_ids (the first stop token ends the output), the context
    length and abort; ``delay_s`` makes each request take that long (load-balancing tests).
    Records every request (`requests`) for assertions.
    """

    name = "scripted"

    def __init__(self, config: RolloutConfig) -> None:
        kwargs = dict(config.engine_kwargs)
        self.policy: Callable[[list[int]], list[int]] = kwargs.get("policy", HashPolicy())
        self.delay_s = float(kwargs.get("delay_s", 0.0))
        self.vocab_size = int(kwargs.get("vocab_size", 512))
        self._max_model_len = config.max_model_len or 4096
        self.requests: list[tuple[str, list[int]]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._aborted: set[str] = set()

    async def _generate(self, request: CheckedRequest) -> list[GenerationOutput]:
        prompt, sampling_params, request_id = request.prompt, request.params, request.request_id
        self.requests.append((request_id, prompt))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if request_id in self._aborted:
                return [GenerationOutput([], [], "abort")] * sampling_params.n
            script = self.policy(prompt)
            limit = min(sampling_params.max_tokens, self._max_model_len - len(prompt))
            tokens, reason = [], "length"
            for token in script:
                if len(tokens) == limit:
                    break
                tokens.append(int(token))
                if token in sampling_params.stop_token_ids:
                    reason = "stop"
                    break
            else:
                reason = "stop" if len(tokens) < limit else "length"
            log_probs = [scripted_log_prob(len(prompt) + i, t) for i, t in enumerate(tokens)]
            return [
                GenerationOutput(list(tokens), list(log_probs), reason)
                for _ in range(sampling_params.n)
            ]
        finally:
            self.in_flight -= 1

    def request_log(self) -> list[tuple[str, list[int]]]:
        """(request id, prompt ids) of every request so far, in arrival order."""
        return [(rid, list(prompt)) for rid, prompt in self.requests]

    async def abort(self, request_ids: list[str]) -> None:
        self._aborted.update(request_ids)

    async def update_weights(
        self, weights: Iterable[tuple[str, Tensor]], version: int | None = None
    ) -> None:
        # a stream fed by the same event loop (a Ray replica's session): drain it off-loop
        await asyncio.to_thread(lambda: [None for _ in weights])

    async def sleep(self, level: int = 1) -> None:
        return None

    async def wake_up(self) -> None:
        return None

    async def reset_prefix_cache(self) -> None:
        return None

    async def shutdown(self) -> None:
        self._closed = True

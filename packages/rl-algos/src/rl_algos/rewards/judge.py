"""A generative reward model: an LLM judge served by a rollout engine.

`GenerativeJudge` fills the `reward.judge` template (`rl_algos.config.judge_section`) with
each sample's prompt, decoded response and ground truth, generates the judge's answers
for the whole batch at once (every request in flight together, up to `max_concurrency`:
the engine batches them; each request limited to `timeout_s`, the batch to
`batch_timeout_s`), and parses each answer into a score (`parse_judgment`).

The judge's answers are untrusted model output: an answer without a score raises
`JudgeParseError`, a judgment past its time `JudgeTimeoutError` (``on_failure: raise``),
or it scores ``failure_score`` (``on_failure: score``); either way it is counted
(``judge/unparseable``, ``judge/timeouts``, ``judge/errors``), never silently 0.

The engine is built by name (`rl_core.rollout.build_rollout_engine`) in the driver process
and driven from a private event-loop thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from rl_algos.config.judge_section import JudgeConfig

__all__ = [
    "GenerativeJudge",
    "JudgeError",
    "JudgeOutcome",
    "JudgeParseError",
    "JudgeTimeoutError",
    "parse_judgment",
    "render_template",
]

log = logging.getLogger(__name__)
T = TypeVar("T")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")


class JudgeError(RuntimeError):
    """A judgment that gave no score (``reward.judge.on_failure: raise``)."""


class JudgeParseError(JudgeError, ValueError):
    """The judge's answer holds no score the parser accepts."""


class JudgeTimeoutError(JudgeError, TimeoutError):
    """A judgment ran past ``reward.judge.timeout_s`` (or the batch's deadline)."""


def render_template(template: str, prompt: str, response: str, ground_truth: str) -> str:
    """The template with its placeholders replaced (one pass: a response that contains
    ``{prompt}`` stays as written)."""
    values = {"{prompt}": prompt, "{response}": response, "{ground_truth}": ground_truth}
    pattern = re.compile("|".join(re.escape(k) for k in values))
    return pattern.sub(lambda m: values[m.group(0)], template)


def parse_judgment(text: str, config: JudgeConfig) -> float:
    """The score in a judge's answer, by `config.parser`; `JudgeParseError` when there is
    none (no number / verdict, a number outside `score_range`, a verdict not listed)."""
    shown = repr(text[:120])
    if config.parser == "number":
        if config.pattern is not None:
            match = re.search(config.pattern, text, flags=re.IGNORECASE | re.DOTALL)
            found = match.group(1) if match else None
        else:
            match = _NUMBER.search(text)
            found = match.group(0) if match else None
        if found is None:
            raise JudgeParseError(f"no number in the judge's answer {shown}")
        try:
            value = float(found)
        except ValueError:
            raise JudgeParseError(
                f"{found!r} in the judge's answer {shown} is not a number"
            ) from None
        low, high = config.score_range
        if not (np.isfinite(value) and low <= value <= high):
            raise JudgeParseError(
                f"{value:g} in the judge's answer {shown} is outside score_range [{low}, {high}]"
            )
        return value
    verdicts = {k.strip().lower(): float(v) for k, v in config.verdicts.items()}
    if config.pattern is not None:
        match = re.search(config.pattern, text, flags=re.IGNORECASE | re.DOTALL)
        word = match.group(1).strip().lower() if match else None
    else:
        words = "|".join(re.escape(k) for k in sorted(verdicts, key=len, reverse=True))
        match = re.search(rf"(?<!\w)({words})(?!\w)", text, flags=re.IGNORECASE)
        word = match.group(1).lower() if match else None
    if word is None or word not in verdicts:
        raise JudgeParseError(
            f"no verdict of {sorted(verdicts)} in the judge's answer {shown}"
            if word is None
            else f"verdict {word!r} in the judge's answer {shown} is not one of {sorted(verdicts)}"
        )
    return verdicts[word]


@dataclass
class JudgeOutcome:
    """One sample's judgment: `status` ok / unparseable / timeout / error, the judge's
    answer, the parsed score (None unless ok) and what went wrong."""

    status: str
    text: str = ""
    score: float | None = None
    error: str = ""


def _stop_token_ids(tokenizer: Any, model_path: str) -> list[int]:
    """Every end-of-sequence id the judge declares: its tokenizer's and its generation
    config's (SmolLM2's chat turns end at ``<|im_end|>``)."""
    ids: list[int] = []

    def add(value: Any) -> None:
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and v not in ids:
                ids.append(v)

    add(getattr(tokenizer, "eos_token_id", None))
    path = os.path.join(model_path, "generation_config.json")
    if os.path.isfile(path):
        with open(path) as f:
            add(json.load(f).get("eos_token_id"))
    return ids


def _prompt_text(raw: Any) -> str:
    """The last user message of a chat prompt (or the prompt string itself)."""
    if isinstance(raw, np.ndarray):
        raw = raw.tolist()
    if isinstance(raw, list | tuple):
        users = [
            m.get("content", "") for m in raw if isinstance(m, dict) and m.get("role") == "user"
        ]
        return str(users[-1]) if users else ""
    return "" if raw is None else str(raw)


def _ground_truth_text(non_tensor: dict[str, np.ndarray], i: int) -> str:
    info = non_tensor.get("reward_model")
    if info is not None and isinstance(info[i], dict) and "ground_truth" in info[i]:
        return str(info[i]["ground_truth"])
    if "ground_truth" in non_tensor and non_tensor["ground_truth"][i] is not None:
        return str(non_tensor["ground_truth"][i])
    return ""


class _LoopThread:
    """A private asyncio event loop in a daemon thread (the engine's coroutines run here)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="judge-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class GenerativeJudge:
    """Scores responses with a judge model (`config`: the `reward.judge` section;
    `model_path`: the resolved judge directory). ``engine``: a started rollout engine to
    use instead of building one from the config (tests). Call `close()` at the end."""

    def __init__(
        self, config: JudgeConfig, model_path: str, seed: int = 0, engine: Any = None
    ) -> None:
        from transformers import AutoTokenizer

        from rl_core.rollout import RolloutConfig, build_rollout_engine

        self.config = config
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.stop_token_ids = _stop_token_ids(self.tokenizer, model_path)
        self.seed = seed
        self._thread = _LoopThread()
        self._requests = 0
        if engine is None:
            rollout_config = RolloutConfig(
                model_path=model_path,
                backend=config.backend,
                dtype=config.dtype,
                seed=seed,
                max_num_seqs=config.max_concurrency,
                engine_kwargs=dict(config.engine_kwargs),
            )
            # built on the loop thread: engines may start background tasks on the running loop
            engine = self._thread.run(_build(build_rollout_engine, rollout_config), 3600.0)
        self.engine = engine

    # ------------------------------------------------------------------ prompts

    def judge_prompt_ids(self, prompt: str, response: str, ground_truth: str = "") -> list[int]:
        """The judge's prompt token ids for one sample."""
        cfg = self.config
        response = response[: cfg.max_response_chars]
        text = render_template(cfg.template, prompt, response, ground_truth)
        if not cfg.apply_chat_template:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        messages = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
        messages.append({"role": "user", "content": text})
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # newer transformers: a BatchEncoding
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    # ------------------------------------------------------------------ judging

    async def _one(self, index: int, ids: list[int], gate: asyncio.Semaphore) -> JudgeOutcome:
        from rl_core.rollout import SamplingParams

        cfg = self.config
        request_id = f"judge-{self._requests}-{index}"
        params = SamplingParams(
            n=1,
            temperature=cfg.temperature,
            max_tokens=cfg.max_new_tokens,
            stop_token_ids=tuple(self.stop_token_ids),
            seed=self.seed + index,
        )
        async with gate:
            try:
                outputs = await asyncio.wait_for(
                    self.engine.generate(ids, params, request_id), cfg.timeout_s
                )
            except TimeoutError:
                await self.engine.abort([request_id])
                return JudgeOutcome("timeout", error=f"no answer within {cfg.timeout_s} s")
            except asyncio.CancelledError:
                await asyncio.shield(self.engine.abort([request_id]))
                raise
            except Exception as exc:  # a prompt the engine refuses (e.g. too long)
                return JudgeOutcome("error", error=f"{type(exc).__name__}: {exc}")
        tokens = [t for t in outputs[0].token_ids if t not in self.stop_token_ids]
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        if outputs[0].finish_reason == "abort":
            return JudgeOutcome("timeout", text=text, error="aborted by the engine")
        try:
            return JudgeOutcome("ok", text=text, score=parse_judgment(text, cfg))
        except JudgeParseError as exc:
            return JudgeOutcome("unparseable", text=text, error=str(exc))

    async def _all(self, prompts: list[list[int]]) -> list[JudgeOutcome]:
        gate = asyncio.Semaphore(self.config.max_concurrency)
        tasks = [asyncio.ensure_future(self._one(i, ids, gate)) for i, ids in enumerate(prompts)]
        done, pending = await asyncio.wait(tasks, timeout=self.config.batch_timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        late = JudgeOutcome(
            "timeout", error=f"batch deadline {self.config.batch_timeout_s} s passed"
        )
        return [t.result() if t in done else late for t in tasks]

    def judge(self, prompts: list[list[int]]) -> list[JudgeOutcome]:
        """Judge every prompt (judge token ids) at once; one outcome each, in order."""
        self._requests += 1
        return self._thread.run(self._all(prompts), self.config.batch_timeout_s + 60.0)

    def score_texts(
        self, prompts: list[str], responses: list[str], ground_truths: list[str] | None = None
    ) -> tuple[list[float], list[JudgeOutcome], dict[str, float]]:
        """Scores (failed judgments: `failure_score`, or raise), outcomes and metrics."""
        truths = ground_truths or [""] * len(responses)
        ids = [
            self.judge_prompt_ids(p, r, g)
            for p, r, g in zip(prompts, responses, truths, strict=True)
        ]
        start = time.monotonic()
        outcomes = self.judge(ids)
        seconds = time.monotonic() - start
        scores: list[float] = []
        for i, outcome in enumerate(outcomes):
            if outcome.score is not None:
                scores.append(outcome.score)
                continue
            if self.config.on_failure == "raise":
                kind = JudgeTimeoutError if outcome.status == "timeout" else JudgeParseError
                raise kind(
                    f"reward.judge: sample {i}: {outcome.error} (reward.judge.on_failure=raise; "
                    "set on_failure=score and failure_score to score such judgments)"
                )
            log.warning("judge: sample %d %s: %s", i, outcome.status, outcome.error)
            scores.append(float(self.config.failure_score))
        count = max(len(outcomes), 1)
        metrics = {
            "judge/unparseable": float(sum(o.status == "unparseable" for o in outcomes)),
            "judge/timeouts": float(sum(o.status == "timeout" for o in outcomes)),
            "judge/errors": float(sum(o.status == "error" for o in outcomes)),
            "judge/score_mean": float(sum(scores) / count),
            "judge/seconds": seconds,
        }
        return scores, outcomes, metrics

    def __call__(self, data: Any, policy_tokenizer: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """Token-level judge scores [B, R] (each on the last response token) of a
        DataProto of generated samples, and the metrics."""
        prompt_len = data.batch["prompts"].shape[-1]
        responses = data.batch["responses"]
        lengths = data.batch["attention_mask"][:, prompt_len:].sum(dim=-1).long()
        texts = policy_tokenizer.batch_decode(
            [responses[i, : int(n)].tolist() for i, n in enumerate(lengths)],
            skip_special_tokens=True,
        )
        non_tensor = data.non_tensor_batch
        if "raw_prompt" in non_tensor:
            prompts = [_prompt_text(p) for p in non_tensor["raw_prompt"]]
        else:
            prompts = policy_tokenizer.batch_decode(data.batch["prompts"], skip_special_tokens=True)
        truths = [_ground_truth_text(non_tensor, i) for i in range(len(texts))]
        scores, _, metrics = self.score_texts(prompts, texts, truths)
        token_level = torch.zeros(responses.shape, dtype=torch.float32)
        rows = torch.arange(len(texts))
        token_level[rows, (lengths - 1).clamp(min=0)] = torch.tensor(scores, dtype=torch.float32)
        return token_level, metrics

    def close(self) -> None:
        """Stop the engine and the loop thread."""
        try:
            self._thread.run(self.engine.shutdown(), 60.0)
        except Exception as exc:  # already gone
            log.warning("judge engine shutdown failed: %s", exc)
        self._thread.close()


async def _build(factory: Any, config: Any) -> Any:
    return factory(config)

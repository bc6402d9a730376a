"""A calculator agent written with the `openai` SDK: four-digit products with a `multiply`
tool. Trained as it is by examples/grpo_openai_agent.yaml (`agent:<this file>:run`).

The model is asked "What is 4821 * 3907?" and offered the tool (described in the system
prompt, since SmolLM2's chat template has no tools section, and passed as `tools=` so the
server parses the call). The agent runs the call, hands back the result and asks for the
answer. A call the model writes without the exact tool-call markup is still taken, as many
agents do: a JSON object that names the tool, or the tool's name followed by two integers. Reward: 1 for the
right product in the final answer after a call; 0.5 for a right call whose result the model
then misreports; 0.4 for a call with wrong factors; without a call, 0.1 for each step
towards one the reply shows (the tool's name, each factor), so the untrained model, which
rarely writes a whole call, still gets a gradient.
"""

from __future__ import annotations

import json
import random
import re

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
        content = message.content or ""
        if message.tool_calls:
            call_id, arguments = message.tool_calls[0].id, _called(message.tool_calls[0])
        else:  # the call written as JSON without the exact markup
            call_id, arguments = "call_0", _json_call(content)
        result = _product(arguments)
        if result is None:
            return _towards_a_call(content, task)
        if result != task["answer"]:
            return 0.4
        messages.append(message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call_id, "content": str(result)})
        final = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=24
        )
        text = (final.choices[0].message.content or "").replace(",", "")
        return 1.0 if str(task["answer"]) in text else 0.5
    finally:
        await client.close()


def _called(call) -> dict | None:
    """The arguments of a parsed `multiply` call (None: another tool or bad JSON)."""
    if call.function.name != "multiply":
        return None
    try:
        return json.loads(call.function.arguments)
    except ValueError:
        return None


def _json_call(text: str) -> dict | None:
    """The arguments of a `multiply` call written without the exact markup: the first JSON
    object in `text` that names the tool, else the first two integers after its name."""
    decoder = json.JSONDecoder()
    for start in [i for i, c in enumerate(text) if c == "{"]:
        try:
            value, _ = decoder.raw_decode(text[start:])
        except ValueError:
            continue
        if isinstance(value, dict) and value.get("name") == "multiply":
            return value.get("arguments")
    if "multiply" in text:
        numbers = re.findall(r"\d+", text[text.index("multiply") :])
        if len(numbers) >= 2:
            return {"a": numbers[0], "b": numbers[1]}
    return None


def _product(arguments: dict | None) -> int | None:
    try:
        return int(arguments["a"]) * int(arguments["b"])
    except (TypeError, KeyError, ValueError):
        return None


def _towards_a_call(text: str, task: dict) -> float:
    """0.1 per step towards a call the reply shows: the tool's name, each factor (0-0.3)."""
    return 0.1 * (("multiply" in text) + (str(task["a"]) in text) + (str(task["b"]) in text))

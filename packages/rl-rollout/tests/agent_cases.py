"""Agents for the agent episode tests (`agent:agent_cases:<name>`): ordinary async code with
the real `openai` client, good and bad ones. Imported in environment worker processes
(this directory is on PYTHONPATH)."""

from __future__ import annotations

import asyncio
import json

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        },
    }
]


def tasks(split, seed, count):
    return [{"a": 2, "b": 3, "answer": "5", "split": split} for _ in range(count)]


def _client(base_url, api_key):
    import openai

    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=30)


async def good(task, base_url, api_key):
    """Ask, run the tool the model calls, ask again; 1.0 when the answer is in the reply."""
    client = _client(base_url, api_key)
    messages = [{"role": "user", "content": f"What is {task['a']} + {task['b']}?"}]
    reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    message = reply.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        args = json.loads(call.function.arguments)
        messages.append(
            {"role": "tool", "tool_call_id": call.id, "content": str(sum(args.values()))}
        )
    final = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    await client.close()
    text = final.choices[0].message.content or ""
    return {"reward": float(task["answer"] in text), "turns": 2}


async def raises(task, base_url, api_key):
    client = _client(base_url, api_key)
    await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}]
    )
    raise ValueError("the agent's own bug")


async def hangs(task, base_url, api_key):
    await asyncio.sleep(3600)


async def returns_text(task, base_url, api_key):
    client = _client(base_url, api_key)
    await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}]
    )
    return "great"


async def steals(task, base_url, api_key):
    """Writes with another episode's session id (row 0's), keeping its own secret."""
    session, secret = api_key.split(".", 1)
    other = session.rsplit("-", 1)[0] + "-0"
    client = _client(base_url, f"{other}.{secret}")
    await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "What is 2 + 3?"}], tools=TOOLS
    )
    return 1.0


async def no_call(task, base_url, api_key):
    return 1.0


def sync_run(task, base_url, api_key):
    return 1.0


async def blocks(task, base_url, api_key):
    """Hangs without yielding to its event loop (a synchronous call that never returns)."""
    import time

    time.sleep(3600)

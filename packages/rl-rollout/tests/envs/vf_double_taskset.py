"""A multi-turn verifiers (0.4) environment, written with verifiers' own classes: the
`Env` asks "Pick a number from 1 to 9.", then (its own control flow, through the agent's
`interaction`) "Now double it."; the reward is 1.0 when the second reply's last number is
twice the first's. Taskset id ``vf_double_taskset``."""

import re

import verifiers.v1 as vf


def _last_number(text: str) -> int | None:
    numbers = re.findall(r"-?\d+", text)
    return int(numbers[-1]) if numbers else None


class DoubleTask(vf.Task[vf.TaskData]):
    @vf.reward
    async def doubled(self, trace: vf.Trace) -> float:
        replies = [m.content or "" for m in trace.assistant_messages]
        if len(replies) < 2:
            return 0.0
        first, second = _last_number(replies[-2]), _last_number(replies[-1])
        return float(first is not None and second == 2 * first)


class DoubleTaskset(vf.Taskset[DoubleTask, vf.TasksetConfig]):
    def load(self):
        for i in range(3):
            yield DoubleTask(
                vf.TaskData(prompt=f"Round {i}. Pick a number from 1 to 9."), self.config.task
            )


class DoubleEnv(vf.Env[vf.SingleAgentEnvConfig]):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as talk:
            await talk.turn()  # the task's prompt speaks first
            await talk.turn("Now double it.")


__all__ = ["DoubleEnv", "DoubleTaskset"]

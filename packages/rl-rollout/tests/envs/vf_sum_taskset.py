"""A single-turn verifiers (0.4) environment, written with verifiers' own classes: "What is
a + b?", rewarded 1.0 when the reply's last number is the sum (the `correct` reward) and
0.1 per reply under 20 characters (`brief`, weight 0.5). Used by test_env_verifiers.py as
the taskset id ``vf_sum_taskset`` (this directory is on sys.path)."""

import re

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: int


class SumTask(vf.Task[SumData]):
    @vf.reward
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        numbers = re.findall(r"-?\d+", trace.last_reply)
        return float(bool(numbers) and int(numbers[-1]) == task.answer)

    @vf.reward(weight=0.5)
    async def brief(self, trace: vf.Trace) -> float:
        return 0.1 if len(trace.last_reply) < 20 else 0.0


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self):
        for a, b in [(2, 3), (10, 7), (4, 4), (9, 1)]:
            data = SumData(
                prompt=f"What is {a} + {b}?", system_prompt="Answer briefly.", answer=a + b
            )
            yield SumTask(data, self.config.task)


__all__ = ["SumTaskset"]

"""A verifiers (0.4) taskset whose reward raises: the adapter must fail the episode with a
named error, never score it. Taskset id ``vf_broken_taskset``."""

import verifiers.v1 as vf


class BrokenTask(vf.Task[vf.TaskData]):
    @vf.reward
    async def explodes(self, trace: vf.Trace) -> float:
        raise RuntimeError("the reward's own bug")


class BrokenTaskset(vf.Taskset[BrokenTask, vf.TasksetConfig]):
    def load(self):
        yield BrokenTask(vf.TaskData(prompt="Say something."), self.config.task)


__all__ = ["BrokenTaskset"]

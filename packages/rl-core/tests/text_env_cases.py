"""Misbehaving text environments for the pool tests (imported by name in worker processes)."""

from __future__ import annotations

import os
import time

from rl_core.text_env import EnvReset, TextEnv, TextEnvStep


class _Base(TextEnv):
    def reset(self, task, seed):
        return EnvReset([{"role": "user", "content": f"task {task.get('i', 0)} seed {seed}"}])


class CrashOnStep(_Base):
    """Raises in step (an exception in the environment's own code)."""

    def step(self, turn):
        raise ZeroDivisionError("division by zero in the env")


class DieOnStep(_Base):
    """Kills its whole worker process in step (a segfault, an OOM kill)."""

    def step(self, turn):
        os._exit(3)


class HangOnStep(_Base):
    """Never answers its step within any sane time-out."""

    def __init__(self, seconds: float = 3600.0) -> None:
        self.seconds = seconds

    def step(self, turn):
        time.sleep(self.seconds)
        return TextEnvStep([], 1.0, terminated=True)


class SlowSteps(_Base):
    """Each step takes `seconds` and never ends the episode (for the episode time limit)."""

    def __init__(self, seconds: float = 0.3) -> None:
        self.seconds = seconds

    def step(self, turn):
        time.sleep(self.seconds)
        return TextEnvStep([{"role": "user", "content": "more"}], 0.0)


class GarbageStep(_Base):
    """Returns a NaN reward."""

    def step(self, turn):
        return TextEnvStep([], float("nan"), terminated=True)


class UnpicklableInfo(_Base):
    def step(self, turn):
        return TextEnvStep([], 1.0, terminated=True, info={"lock": __import__("threading").Lock()})


class Sleeper(_Base):
    """Sleeps `seconds` in step, then answers with the worker's pid (for concurrency)."""

    def __init__(self, seconds: float = 0.5) -> None:
        self.seconds = seconds

    def step(self, turn):
        time.sleep(self.seconds)
        return TextEnvStep([], 1.0, terminated=True, info={"pid": os.getpid()})


class ReportsModules(_Base):
    """Answers with what its worker process has imported."""

    def step(self, turn):
        import sys

        heavy = sorted(m for m in ("torch", "transformers", "numpy", "pytest") if m in sys.modules)
        return TextEnvStep([], 1.0, terminated=True, info={"heavy": heavy, "pid": os.getpid()})


class Counted(_Base):
    """Says in its reset info how many instances this process built and which one it is."""

    built = 0

    def __init__(self) -> None:
        Counted.built += 1
        self.number = Counted.built

    def reset(self, task, seed):
        first = super().reset(task, seed)
        first.info = {"built": Counted.built, "instance": self.number, "pid": os.getpid()}
        return first

    def step(self, turn):
        if turn.text == "crash":
            raise RuntimeError("asked to crash")
        return TextEnvStep([], 1.0, terminated=True)


class CountedOnce(Counted):
    """A `Counted` that cannot be reset for a second episode."""

    reusable = False

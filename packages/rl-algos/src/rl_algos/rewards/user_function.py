"""A reward function defined in a user's Python file.

Light on purpose (no torch, no rl_core): scoring worker processes import it.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

from rl_core.config import did_you_mean

__all__ = ["FileRewardFunction"]

_FILE_MODULES: dict[tuple[str, float], Any] = {}


def _load_module(path: Path) -> Any:
    key = (str(path), path.stat().st_mtime)
    if key not in _FILE_MODULES:
        name = f"rl_user_reward_{abs(hash(key))}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import reward file {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        _FILE_MODULES[key] = module
    return _FILE_MODULES[key]


class FileRewardFunction:
    """A reward function defined in a Python file, imported lazily in each process
    (pickles as path + name, so it can run in spawned worker processes)."""

    def __init__(self, path: str | Path, name: str = "compute_score") -> None:
        self.path = Path(path).expanduser().resolve()
        self.name = name

    def resolve(self) -> Any:
        module = _load_module(self.path)
        fn = getattr(module, self.name, None)
        if not callable(fn):
            functions = [n for n, v in vars(module).items() if inspect.isfunction(v)]
            raise AttributeError(
                f"reward file {self.path} has no function {self.name!r}"
                f"{did_you_mean(self.name, functions)} (functions: {', '.join(functions) or 'none'})"
            )
        return fn

    def __call__(self, *args: Any, **kwargs: Any) -> float | dict[str, Any]:
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"FileRewardFunction({str(self.path)!r}, {self.name!r})"

"""The one way a typed config is built and checked: `build`, `validate`, `ConfigError`.

Every config in every package is a dataclass. `build(cls, mapping, path)` makes one from
plain data (YAML through OmegaConf, ``engine_kwargs``, a dict sent to a worker):

* unknown keys are refused (with the closest valid key, or the new name of a renamed key
  from the class's ``RENAMED`` mapping);
* each value is checked against the field's annotation (``int``, ``float``, ``bool``,
  ``str``, ``Literal[...]``, ``X | None``, ``list[X]``, ``tuple[...]``, ``dict[str, X]``,
  nested config dataclasses); an ``int`` is accepted for a ``float`` and a list for a
  tuple, nothing else is converted;
* then the class's own rules run: ``__post_init__`` and a ``check()`` method, which raise
  `ConfigError` with the field's name (use `check`).

Every error is a `ConfigError` that carries the full dotted ``path``, the ``value``, what
was ``expected`` and a ``suggestion``; code reads those attributes, never the message
text. Imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import sys
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar

__all__ = [
    "NOTHING",
    "ConfigError",
    "build",
    "check",
    "closest",
    "dataclass_from_dict",
    "describe",
    "did_you_mean",
    "is_int",
    "is_real",
    "key_of",
    "validate",
]

T = TypeVar("T")


class _Nothing:
    """No value (a missing key, a rule that spans fields)."""

    def __repr__(self) -> str:
        return "NOTHING"


NOTHING: Any = _Nothing()


class ConfigError(ValueError):
    """A config key or value that is not accepted.

    ``path``: the dotted key (relative to where it was raised; `under` prefixes the
    section); ``value``: what was given (`NOTHING` for a missing key or a rule between
    fields); ``expected``: what is accepted; ``suggestion``: the closest valid key or
    choice, or None; ``problem``: ``invalid value``, ``unknown key``, ``missing``,
    ``renamed`` or ``conflict``. The message is one line built from these.
    """

    def __init__(
        self,
        path: str,
        expected: str,
        *,
        value: Any = NOTHING,
        problem: str = "invalid value",
        suggestion: str | None = None,
    ) -> None:
        self.path, self.expected, self.value = path, expected, value
        self.problem, self.suggestion = problem, suggestion
        super().__init__(self._message())

    def _message(self) -> str:
        given = "" if self.value is NOTHING else f" {self.value!r}"
        expected = f"; expected {self.expected}" if self.expected else ""
        if self.problem == "renamed":
            return f"{self.path}: renamed to {self.expected!r}"
        hint = f"; did you mean {self.suggestion!r}?" if self.suggestion else ""
        head = f"{self.path}: " if self.path else ""
        if self.problem.startswith("unknown key"):  # expected: the keys that exist
            return f"{head}{self.problem}{hint} ({self.expected})"
        return f"{head}{self.problem}{given}{expected}{hint}"

    @property
    def key(self) -> str:
        """The dotted path (the name the CLI and older code use)."""
        return self.path

    @property
    def detail(self) -> str:
        """The message without the path."""
        return str(self)[len(self.path) + 2 :] if self.path else str(self)

    def under(self, prefix: str) -> ConfigError:
        """The same error with ``prefix.`` in front of the path."""
        path = ".".join(p for p in (prefix, self.path) if p)
        return type(self)(
            path,
            self.expected,
            value=self.value,
            problem=self.problem,
            suggestion=self.suggestion,
        )

    def __reduce__(self) -> tuple[Any, ...]:  # travels through Ray and multiprocessing
        return (
            _rebuild,
            (type(self), self.path, self.expected, self.value, self.problem, self.suggestion),
        )


def _rebuild(cls: type, path: str, expected: str, value: Any, problem: str, suggestion: Any) -> Any:
    return cls(path, expected, value=value, problem=problem, suggestion=suggestion)


def closest(word: Any, candidates: Iterable[Any]) -> str | None:
    """The candidate closest to ``word`` (difflib, cutoff 0.6), or None."""
    names = [str(c) for c in candidates]
    match = difflib.get_close_matches(str(word), names, n=1, cutoff=0.6)
    return match[0] if match else None


def did_you_mean(word: Any, candidates: Iterable[Any]) -> str:
    """ "; did you mean 'x'?" for the closest candidate, or "" (for messages that are not
    a `ConfigError`)."""
    match = closest(word, candidates)
    return f"; did you mean {match!r}?" if match else ""


def check(
    ok: bool, path: str, value: Any, expected: str, choices: Iterable[Any] | None = None
) -> None:
    """Raise `ConfigError` for ``path`` unless ``ok`` (``choices``: suggest the closest)."""
    if ok:
        return
    suggestion = closest(value, choices) if choices is not None and isinstance(value, str) else None
    raise ConfigError(path, expected, value=value, suggestion=suggestion)


def is_int(value: Any) -> bool:
    """An integer, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A finite int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ---------------------------------------------------------------------------- types


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _config_class(hint: Any) -> type | None:
    """The one dataclass type in ``hint`` (``X`` or ``X | None``), or None."""
    candidates = typing.get_args(hint) if _is_union(hint) else (hint,)
    found = [t for t in candidates if isinstance(t, type) and dataclasses.is_dataclass(t)]
    return found[0] if len(found) == 1 else None


def describe(hint: Any) -> str:
    """What a value of type ``hint`` looks like, in words for an error or the docs."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return "any value"
    if hint is type(None):
        return "null"
    if hint is bool:
        return "true or false"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint is str:
        return "a string"
    if origin is Literal:
        return f"one of {list(args)}"
    if _is_union(hint):
        return " or ".join(describe(a) for a in args)
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        return f"a list of {len(args)} items ({', '.join(describe(a) for a in args)})"
    if origin in (list, tuple, Sequence) and args:
        return f"a list of {describe(args[0])}"
    if origin in (list, tuple, Sequence):
        return "a list"
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return "a mapping" + (f" of {describe(args[1])}" if len(args) == 2 else "")
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return f"a mapping of {hint.__name__} fields"
    return getattr(hint, "__name__", str(hint))


def _convert(value: Any, hint: Any, path: str) -> Any:
    """``value`` as the type ``hint`` says, or a ConfigError naming ``path``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or isinstance(hint, (str, TypeVar)):  # unresolvable annotations pass
        return value
    if _is_union(hint):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        config = _config_class(hint)
        if len(options) == 1 or (config is not None and isinstance(value, Mapping)):
            # one candidate: its error is the one to show (a nested one keeps its path)
            try:
                return _convert(value, config if len(options) > 1 else options[0], path)
            except ConfigError as exc:
                if exc.path != path:
                    raise
                raise ConfigError(path, describe(hint), value=value) from None
        for arg in options:
            try:
                return _convert(value, arg, path)
            except ConfigError:
                continue
        raise ConfigError(path, describe(hint), value=value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return build(hint, value, path)
    if hint is bool:
        check(isinstance(value, bool), path, value, "true or false")
        return value
    if hint is int:
        check(is_int(value), path, value, "an integer")
        return value
    if hint is float:
        check(is_real(value), path, value, "a finite number")
        return float(value)
    if hint is str:
        check(isinstance(value, str), path, value, "a string")
        return value
    if origin is Literal:
        choices = list(args)
        check(value in choices and type(value) in {type(c) for c in choices}, path, value,
              f"one of {choices}", choices)  # fmt: skip
        return value
    if origin in (list, tuple, Sequence) or hint in (list, tuple):
        check(isinstance(value, (list, tuple)), path, value, describe(hint))
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            check(len(value) == len(args), path, value, describe(hint))
            return tuple(
                _convert(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args))
            )
        item = args[0] if args else Any
        items = [_convert(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
        return items if origin is list or hint is list else tuple(items)
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        check(isinstance(value, Mapping), path, value, describe(hint))
        item = args[1] if len(args) == 2 else Any
        for key in value:
            check(isinstance(key, str), f"{path}.{key}", key, "string keys")
        return {k: _convert(v, item, f"{path}.{k}") for k, v in value.items()}
    if isinstance(hint, type):
        check(isinstance(value, hint), path, value, describe(hint))
    return value


def _hints(cls: type) -> dict[str, Any]:
    """Field name -> resolved annotation; one that cannot be resolved (a name imported
    only under TYPE_CHECKING) is ``Any``: its value is not type-checked."""
    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError):
        namespace = vars(sys.modules[cls.__module__])
        hints = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            try:
                hints[f.name] = eval(f.type, namespace) if isinstance(f.type, str) else f.type
            except Exception:
                hints[f.name] = Any
        return hints


def _unknown_key(cls: type, key: Any, names: list[str], path: str) -> ConfigError:
    renamed = getattr(cls, "RENAMED", {}).get(key)
    where = f"{path}.{key}" if path else str(key)
    if renamed is not None:
        return ConfigError(where, renamed, problem="renamed")
    return ConfigError(
        where,
        f"{path or 'the top level'} has: {', '.join(names)}",
        problem=f"unknown key {key!r}",
        suggestion=closest(key, names),
    )


def _run_rules(obj: Any, path: str) -> None:
    rules = getattr(obj, "check", None)
    if callable(rules):
        try:
            rules()
        except ConfigError as exc:
            raise exc.under(path) from None


def build(cls: type[T], data: Any, path: str = "") -> T:
    """A ``cls`` config from a mapping of its field names (nested mappings for nested
    configs); ``path`` is the dotted name of ``data`` in errors. An instance of ``cls``
    is validated and returned as it is."""
    if isinstance(data, cls):
        return validate(data, path)
    if not isinstance(data, Mapping):
        raise ConfigError(path, describe(cls), value=data)
    fields = {key_of(f): f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    names = list(fields)
    for key in data:
        if key not in fields:
            raise _unknown_key(cls, key, names, path)
    hints = _hints(cls)
    join = (lambda k: f"{path}.{k}") if path else (lambda k: k)
    for key, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and key not in data:
            raise ConfigError(join(key), describe(hints.get(f.name, Any)), problem="missing")
    kwargs = {
        fields[key].name: _convert(value, hints.get(fields[key].name, Any), join(key))
        for key, value in data.items()
    }
    try:
        obj = cls(**kwargs)
    except ConfigError as exc:  # a __post_init__ rule
        raise exc.under(path) from None
    _run_rules(obj, path)
    return obj


def key_of(f: dataclasses.Field) -> str:
    """The key of a field in config data: its name, or ``metadata["key"]`` for a name
    that cannot be a Python identifier (e.g. the ``async`` section)."""
    return f.metadata.get("key", f.name)


def validate(obj: T, path: str = "") -> T:
    """Check a config object made in Python (``Cfg(lr=...)``) as `build` checks data:
    every field's type, nested configs, then the class's ``check()``; returns ``obj``
    (with ints of float fields made floats and lists of tuple fields made tuples)."""
    hints = _hints(type(obj))
    join = (lambda k: f"{path}.{k}") if path else (lambda k: k)
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        hint = hints.get(f.name, Any)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            converted = validate(value, join(key_of(f)))
        else:
            converted = _convert(value, hint, join(key_of(f)))
        if converted is not value:
            object.__setattr__(obj, f.name, converted)  # frozen configs too
    _run_rules(obj, path)
    return obj


def dataclass_from_dict(cls: type[T], data: Any, where: str) -> T:
    """`build` under its former name (kept for third-party engines; prefer `build`)."""
    return build(cls, data, where)

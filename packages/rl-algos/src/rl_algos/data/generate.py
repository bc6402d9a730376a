"""Write a generated task's splits: ``python -m rl_algos.data.generate`` (or ``rl data``)
``arithmetic --out DIR --train-size 2000 --max-value 20``; every task field is an option.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_algos.data.io import write_rows
from rl_algos.data.tasks import TASKS, make_splits, task_factory

__all__ = ["main", "write_task"]


def write_task(
    task: str,
    out_dir: str | Path,
    train_size: int = 1000,
    test_size: int = 100,
    seed: int = 0,
    file_format: str = "parquet",
    extra_splits: dict[str, tuple[int, dict[str, Any]]] | None = None,
    train_repeats: bool = False,
    **task_options: Any,
) -> dict[str, Path]:
    """Write `train`, `test` and one file per `extra_splits` entry (name -> (size, option
    overrides), disjoint) under `out_dir`; `train_repeats`: see `make_splits`."""
    factory = task_factory(task)
    if file_format not in ("parquet", "jsonl"):
        raise ValueError(f"unknown format {file_format!r}; expected 'parquet' or 'jsonl'")
    extra = {
        name: (factory(**{**task_options, **overrides}), size)
        for name, (size, overrides) in (extra_splits or {}).items()
    }
    source = factory(**task_options)
    splits = make_splits(source, train_size, test_size, seed, extra, train_repeats)
    return {
        name: write_rows(rows, Path(out_dir) / f"{name}.{file_format}")
        for name, rows in splits.items()
    }


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The argument parser (the `rl data` command reuses it)."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Write a generated task as train/test files."
    )
    tasks = parser.add_subparsers(dest="task", required=True)
    for name, cls in sorted(TASKS.items()):
        sub = tasks.add_parser(name, help=(cls.__doc__ or "").split("\n")[0])
        sub.add_argument("--out", required=True, help="output directory")
        sub.add_argument("--train-size", type=int, default=1000)
        sub.add_argument("--test-size", type=int, default=100)
        sub.add_argument("--seed", type=int, default=0)
        sub.add_argument(
            "--format", dest="file_format", choices=["parquet", "jsonl"], default="parquet"
        )
        for field in dataclasses.fields(cls):
            flag = "--" + field.name.replace("_", "-")
            annotation = str(field.type)
            if isinstance(field.default, tuple) or annotation.startswith("tuple"):
                item = int if annotation.startswith("tuple[int") else str
                sub.add_argument(flag, dest=field.name, nargs="+", type=item, default=field.default)
            elif isinstance(field.default, bool):
                sub.add_argument(
                    flag,
                    dest=field.name,
                    action=argparse.BooleanOptionalAction,
                    default=field.default,
                )
            elif annotation.startswith("int"):
                sub.add_argument(flag, dest=field.name, type=int, default=field.default)
            elif field.default is None or isinstance(field.default, str):
                sub.add_argument(flag, dest=field.name, type=str, default=field.default)
            else:
                sub.add_argument(
                    flag, dest=field.name, type=type(field.default), default=field.default
                )
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    args = vars(build_parser(prog).parse_args(argv))
    task = args.pop("task")
    fields = {f.name for f in dataclasses.fields(TASKS[task])}
    options = {k: (tuple(v) if isinstance(v, list) else v) for k, v in args.items() if k in fields}
    paths = write_task(
        task,
        args["out"],
        args["train_size"],
        args["test_size"],
        args["seed"],
        args["file_format"],
        **options,
    )
    sizes = {"train": args["train_size"], "test": args["test_size"]}
    for split, path in paths.items():
        print(f"{task} {split}: {sizes[split]} rows -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

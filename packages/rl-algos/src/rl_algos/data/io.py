"""Read and write verl-style rows as parquet or JSON lines.

A row: ``prompt`` (chat messages or text), ``data_source`` (its reward function),
``reward_model`` (``{"style": "rule", "ground_truth": ...}``), ``extra_info`` and any other
columns (non-tensor fields).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["read_rows", "write_rows"]

_FORMATS = (".parquet", ".jsonl", ".json")


def _format(path: Path) -> str:
    if path.suffix not in _FORMATS:
        raise ValueError(
            f"data file {str(path)!r}: unknown format {path.suffix!r}; expected one of {list(_FORMATS)}"
        )
    return "parquet" if path.suffix == ".parquet" else "jsonl"


def read_rows(paths: str | Path | Sequence[str | Path]) -> list[dict[str, Any]]:
    """All rows of one or more parquet / jsonl files, in order."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    rows: list[dict[str, Any]] = []
    for raw in paths:
        path = Path(raw).expanduser()
        fmt = _format(path)
        if not path.is_file():
            raise FileNotFoundError(f"data file {str(path)!r} does not exist")
        if fmt == "parquet":
            import pyarrow.parquet as pq

            rows.extend(pq.read_table(path).to_pylist())
            continue
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{number}: not a JSON object: {exc}") from exc
    return rows


def write_rows(rows: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """Write rows to `path` (.parquet or .jsonl), creating parent directories."""
    out = Path(path).expanduser()
    fmt = _format(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), out)
    else:
        with out.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return out

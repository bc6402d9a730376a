"""The trainer's checkpoints: ``checkpoints/step_N`` (engines' ``actor/``, ``critic/``,
``trainer_state.json``, a manifest) published by `rl_core.checkpoint`; ``latest`` names the
newest. ``resume=latest`` falls back to the newest step that verifies (saying why); an
explicit path that does not verify is an error naming the bad file.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rl_core.checkpoint import (
    CheckpointCorruptError,
    CheckpointError,
    describe_write_failure,
    discard_staging,
    fsync_dir,
    publish,
    staging_path,
    verify_manifest,
    write_manifest,
)

__all__ = ["CHECKPOINT_STATE", "find_resume_checkpoint", "read_state", "save_step"]

log = logging.getLogger(__name__)
CHECKPOINT_STATE = "trainer_state.json"
_STEP = re.compile(r"step_(\d+)")


def _write_pointer(root: Path, name: str) -> None:
    tmp = root / "latest.tmp"
    with tmp.open("w") as f:
        f.write(name)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / "latest")  # readers never see a half-written pointer
    fsync_dir(root)


def _steps(root: Path) -> list[int]:
    found = (_STEP.fullmatch(p.name) for p in root.iterdir()) if root.is_dir() else ()
    return sorted(int(m.group(1)) for m in found if m)


def save_step(
    root: Path,
    step: int,
    write_engines: Callable[[Path], None],
    state: dict[str, Any],
    keep: int | None,
) -> Path:
    """Write ``root/step_<step>`` atomically (engines via `write_engines(staging)`, state,
    manifest), move ``latest``, prune to `keep`; on failure raise `CheckpointError`, leaving
    earlier checkpoints and ``latest`` untouched."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    staging = staging_path(final)
    try:
        discard_staging(final)
        staging.mkdir()
        write_engines(staging)
        (staging / CHECKPOINT_STATE).write_text(json.dumps(state, indent=1))
        write_manifest(staging, {"step": step})
        publish(staging, final)
        _write_pointer(root, final.name)
    except Exception as exc:
        discard_staging(final)
        intact = [f"step_{s}" for s in _steps(root)]
        cause = _root_cause(exc)
        what = (
            str(cause)
            if isinstance(cause, CheckpointError)
            else describe_write_failure(final, cause)
        )
        raise CheckpointError(
            f"saving checkpoint {final} failed: {what}; "
            f"kept the earlier checkpoints: {', '.join(intact) or 'none'}"
        ) from exc
    if keep:
        for old in _prunable(_steps(root), step, keep):
            shutil.rmtree(root / f"step_{old}", ignore_errors=True)
    return final


def _prunable(steps: list[int], newest: int, keep: int) -> list[int]:
    """Steps to delete so `keep` remain: never the one just written; steps after it (an
    abandoned timeline) go first."""
    others = [s for s in steps if s != newest]
    # oldest first: the abandoned later steps, then the earlier ones in order
    order = [s for s in others if s > newest] + [s for s in others if s < newest]
    return order[: max(0, len(others) - (keep - 1))]


def _root_cause(exc: BaseException) -> BaseException:
    """The engine's own error inside a worker-group error (e.g. its CheckpointError)."""
    seen = {id(exc)}
    current = exc
    while True:
        inner = getattr(current, "original", None) or current.__cause__
        if inner is None or id(inner) in seen:
            return current
        if isinstance(inner, CheckpointError):
            return inner
        seen.add(id(inner))
        current = inner


def read_state(path: Path) -> dict[str, Any]:
    """The trainer state of a verified checkpoint directory."""
    return json.loads((path / CHECKPOINT_STATE).read_text())


def find_resume_checkpoint(root: Path, resume: str | None) -> Path | None:
    """The checkpoint to resume from, verified: None (start fresh), the newest intact one
    for ``latest``, or `resume` as a path (raises `CheckpointCorruptError` if it is bad)."""
    if not resume:
        return None
    if resume != "latest":
        path = Path(resume)
        if not path.is_dir():
            raise FileNotFoundError(
                f"trainer.resume={resume!r}: no such checkpoint directory; expected 'latest' "
                "or a path like <output_dir>/checkpoints/step_N"
            )
        verify_manifest(path)
        return path
    pointer = root / "latest"
    named = pointer.read_text().strip() if pointer.is_file() else None
    candidates = [f"step_{s}" for s in reversed(_steps(root))]
    if named in candidates:  # the pointer first, then newest to oldest
        candidates.remove(named)
        candidates.insert(0, named)
    skipped: list[str] = []
    for name in candidates:
        try:
            verify_manifest(root / name)
        except CheckpointCorruptError as exc:
            log.warning("resume=latest: skipping %s: %s", name, exc)
            skipped.append(f"{name} ({exc.file}: {exc.reason})")
            continue
        if skipped:
            log.warning(
                "resume=latest: falling back to %s, the newest intact checkpoint (not intact: %s)",
                root / name,
                "; ".join(skipped),
            )
        return root / name
    if skipped:
        raise CheckpointCorruptError(
            root, "step_*", f"no intact checkpoint to resume from: {'; '.join(skipped)}"
        )
    log.info("resume=latest: no checkpoint in %s, starting fresh", root)
    return None

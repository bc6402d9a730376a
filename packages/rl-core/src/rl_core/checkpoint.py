"""The checkpoint contract every engine and the trainer follow: atomic publish, fsync,
and a manifest of sizes and SHA-256 checksums that is verified before anything is loaded.

Rules (a Megatron engine, the FSDP engine and the trainer apply the same ones):

1. Write everything into a staging directory next to the target (`staging_path`);
   never delete or rename the previous valid checkpoint first.
2. `write_manifest(staging)` last: it fsyncs every file and directory below `staging`,
   then writes ``manifest.json`` (each file's size and sha256; a subdirectory that holds
   its own manifest, e.g. an engine's checkpoint inside the trainer's, is recorded by
   that manifest's checksum and verified recursively).
3. `publish(staging, final)`: one atomic rename when `final` does not exist, an atomic
   exchange (``renameat2(RENAME_EXCHANGE)``) when it does, then the old copy is removed.
   At every instant `final` is either the old complete checkpoint or the new one.
4. Before loading, `verify_manifest(path)`: a missing manifest, a missing, truncated or
   changed file raises `CheckpointCorruptError` naming the file and what is wrong.
5. Pickled state is read with ``torch.load(..., weights_only=True)`` only.

This module imports nothing heavy (standard library only).
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "MANIFEST",
    "CheckpointCorruptError",
    "CheckpointError",
    "describe_write_failure",
    "discard_staging",
    "fsync_dir",
    "fsync_tree",
    "publish",
    "staging_path",
    "verify_manifest",
    "write_manifest",
]

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
_RENAME_EXCHANGE = 2  # linux/fs.h


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint failed verification; `path` is the checkpoint, `file` the bad file
    (relative to `path`), `reason` what is wrong with it."""

    def __init__(self, path: str | Path, file: str, reason: str) -> None:
        self.path, self.file, self.reason = str(path), file, reason
        super().__init__(f"checkpoint {self.path}: {file}: {reason}")


def fsync_dir(path: str | Path) -> None:
    """Make a directory's entries (created, renamed, removed files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """fsync every file and directory below `root`, then `root` itself."""
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            _fsync_file(os.path.join(directory, name))
        fsync_dir(directory)


def staging_path(final: str | Path) -> Path:
    """Where a checkpoint for `final` is written before `publish` (same file system)."""
    final = Path(final)
    return final.with_name(f".{final.name}.partial")


def discard_staging(final: str | Path) -> None:
    """Remove a left-over staging directory of `final` (an interrupted save)."""
    shutil.rmtree(staging_path(final), ignore_errors=True)


def describe_write_failure(path: str | Path, exc: BaseException) -> str:
    """`exc` as one line plus the free space where `path` is written (a full disk often
    surfaces as a library's short-write error, not as ENOSPC)."""
    text = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return text
    return f"{text} (free space on that file system: {free / 2**20:.1f} MiB)"


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _entries(root: Path) -> Iterator[tuple[str, Path, bool]]:
    """(relative name, path, is a nested manifest) for what a manifest of `root` lists:
    regular files, and for subdirectories with their own manifest only that manifest."""
    for directory, dirs, files in os.walk(root):
        here = Path(directory)
        nested = [d for d in dirs if (here / d / MANIFEST).is_file()]
        for d in nested:
            yield (here / d / MANIFEST).relative_to(root).as_posix(), here / d / MANIFEST, True
        dirs[:] = sorted(d for d in dirs if d not in nested)
        for name in sorted(files):
            if here == root and name == MANIFEST:
                continue
            yield (here / name).relative_to(root).as_posix(), here / name, False


def write_manifest(root: str | Path, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """fsync everything below `root`, then write its manifest (atomically, fsynced).
    Call it last, after every file of the checkpoint is complete."""
    root = Path(root)
    fsync_tree(root)
    files: dict[str, dict[str, Any]] = {}
    nested: list[str] = []
    for name, path, is_nested in _entries(root):
        files[name] = {"size": path.stat().st_size, "sha256": _sha256(path)}
        if is_nested:
            nested.append(name)
    manifest = {"format": MANIFEST_FORMAT, "files": files, "nested": nested, **(meta or {})}
    tmp = root / f".{MANIFEST}.tmp"
    with tmp.open("w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / MANIFEST)
    fsync_dir(root)
    return manifest


def verify_manifest(root: str | Path, _top: Path | None = None) -> dict[str, Any]:
    """The manifest of `root` after checking every file it lists (recursively);
    raises `CheckpointCorruptError` naming the first bad file."""
    root = Path(root)
    top = _top or root
    where = root.relative_to(top).as_posix()

    def rel(name: str) -> str:
        return name if where == "." else f"{where}/{name}"

    manifest_file = root / MANIFEST
    if not root.is_dir():
        raise CheckpointCorruptError(top, rel(""), "no such checkpoint directory")
    if not manifest_file.is_file():
        raise CheckpointCorruptError(
            top, rel(MANIFEST), "missing: the save did not finish, or an older version wrote it"
        )
    try:
        manifest = json.loads(manifest_file.read_text())
        files = manifest["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointCorruptError(top, rel(MANIFEST), f"unreadable ({exc})") from None
    for name, entry in files.items():
        path = root / name
        if not path.is_file():
            raise CheckpointCorruptError(top, rel(name), "missing")
        size = path.stat().st_size
        if size != entry["size"]:
            raise CheckpointCorruptError(
                top, rel(name), f"truncated or extended: {size} bytes, expected {entry['size']}"
            )
        if _sha256(path) != entry["sha256"]:
            raise CheckpointCorruptError(top, rel(name), "contents changed (sha256 mismatch)")
    for name in manifest.get("nested", []):
        verify_manifest(root / Path(name).parent, top)
    return manifest


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"renameat2(RENAME_EXCHANGE) {a} <-> {b}: {os.strerror(err)}")


def publish(staging: str | Path, final: str | Path) -> None:
    """Make the complete checkpoint at `staging` visible as `final` atomically (rule 3);
    `staging` must hold a manifest (`write_manifest`)."""
    staging, final = Path(staging), Path(final)
    if not (staging / MANIFEST).is_file():
        raise CheckpointError(f"refusing to publish {staging}: it has no {MANIFEST}")
    if not final.exists():
        os.rename(staging, final)
    elif _exchange(staging, final):
        fsync_dir(final.parent)
        shutil.rmtree(staging)  # now the previous checkpoint
    else:  # no atomic exchange here: keep the old one until the new one is in place
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        log.warning(
            "no atomic directory exchange on this file system; replacing %s in two steps", final
        )
        os.rename(final, old)
        os.rename(staging, final)
        fsync_dir(final.parent)
        shutil.rmtree(old)
    fsync_dir(final.parent)

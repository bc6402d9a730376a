"""Rollout frames as files to look at: a PNG strip (rows: episodes, columns: steps) and a GIF."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["frame_strip", "save_frames"]


def frame_strip(frames: Sequence[np.ndarray], max_envs: int = 8) -> np.ndarray:
    """``frames[t]`` is uint8 ``[B, H, W, 3]``: one ``[rows*H, T*W, 3]`` image, 1-px gaps."""
    if not frames:
        raise ValueError("frames: empty, expected at least one [B, H, W, 3] array")
    b = min(max_envs, frames[0].shape[0])
    h, w = frames[0].shape[1:3]
    out = np.full((b * (h + 1), len(frames) * (w + 1), 3), 255, np.uint8)
    for t, batch in enumerate(frames):
        for i in range(b):
            out[i * (h + 1) : i * (h + 1) + h, t * (w + 1) : t * (w + 1) + w] = batch[i]
    return out


def save_frames(
    frames: Sequence[np.ndarray], directory: str | Path, name: str, max_envs: int = 8
) -> dict[str, Path]:
    """Write `directory`/``<name>.png`` (the strip) and ``<name>.gif`` (episodes side by side)."""
    from PIL import Image

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    strip = directory / f"{name}.png"
    Image.fromarray(frame_strip(frames, max_envs)).save(strip)
    b = min(max_envs, frames[0].shape[0])
    tiles = [Image.fromarray(np.concatenate(list(batch[:b]), axis=1)) for batch in frames]
    gif = directory / f"{name}.gif"
    tiles[0].save(gif, save_all=True, append_images=tiles[1:], duration=300, loop=0)
    return {"strip": strip, "gif": gif}

"""``shapes``: a generated vision task that needs no download, and its rule-based reward.

56x56 images, one large shape and two small ones of the other colours; answer the large
one's colour with ``r``, ``g`` or ``b`` (the package README). Reward: 1.0 for the right first
letter, 0.1 for another valid letter (format credit), else 0.
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass
from typing import Any

__all__ = ["COLOURS", "ShapesTask", "compute_score", "draw_shapes"]

COLOURS = {"r": (230, 40, 40), "g": (40, 200, 60), "b": (50, 80, 235)}
QUESTION = "<image>Largest shape colour? Answer r, g or b."


def draw_shapes(
    size: int, big: tuple[str, str, int, int, int], small: list[tuple[str, str, int, int, int]]
) -> bytes:
    """PNG bytes of the shapes, each ``(colour letter, "square"|"disc", x, y, side)``."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), (0, 0, 0))
    draw = ImageDraw.Draw(image)
    for letter, kind, x, y, side in [big, *small]:
        box = (x, y, x + side - 1, y + side - 1)
        (draw.rectangle if kind == "square" else draw.ellipse)(box, fill=COLOURS[letter])
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


@dataclass
class ShapesTask:
    """Rows asking for the colour of the largest shape (see the module docstring)."""

    image_size: int = 56
    min_big: float = 0.55  # the large shape's side, as a fraction of the image side
    max_big: float = 0.8
    small_side: int = 8
    system_prompt: str | None = None

    data_source = "shapes"

    def __post_init__(self) -> None:
        if not 0 < self.min_big <= self.max_big <= 1:
            raise ValueError(
                f"shapes: need 0 < min_big <= max_big <= 1, got {self.min_big}, {self.max_big}"
            )
        if self.image_size < 28 or self.small_side * 2 > self.image_size * self.min_big:
            raise ValueError(
                f"shapes: image_size={self.image_size}, small_side={self.small_side}: expected "
                "image_size >= 28 and small shapes at most half the large one"
            )

    def sample(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        """(problem key, row) for one random image."""
        size = self.image_size
        letters = list(COLOURS)
        rng.shuffle(letters)
        side = rng.randint(int(self.min_big * size), int(self.max_big * size))
        big = (
            letters[0],
            rng.choice(["square", "disc"]),
            rng.randint(0, size - side),
            rng.randint(0, size - side),
            side,
        )
        small = [
            (
                letter,
                rng.choice(["square", "disc"]),
                rng.randint(0, size - self.small_side),
                rng.randint(0, size - self.small_side),
                self.small_side,
            )
            for letter in letters[1:]
        ]
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": QUESTION})
        row = {
            "data_source": self.data_source,
            "prompt": messages,
            "images": [{"bytes": draw_shapes(size, big, small)}],
            "ability": "vision",
            "reward_model": {"style": "rule", "ground_truth": letters[0]},
            "extra_info": {"shapes": repr([big, *small])},
        }
        return repr((big, small)), row


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None
) -> dict[str, float]:
    """1.0 right letter, 0.1 another valid letter, 0 otherwise (``acc``: right or not)."""
    answer = solution_str.strip()[:1].lower()
    truth = str(ground_truth).strip().lower()
    if truth not in COLOURS:
        raise ValueError(f"shapes: ground_truth={ground_truth!r}: expected one of {list(COLOURS)}")
    correct = answer == truth
    score = 1.0 if correct else (0.1 if answer in COLOURS else 0.0)
    return {"score": score, "acc": float(correct)}

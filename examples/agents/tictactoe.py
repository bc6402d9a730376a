"""A fixed TextArena opponent for examples/grpo_textarena.yaml: a random legal move
(deterministic in the position, so a game is reproducible from its seed)."""

from __future__ import annotations

import random
import re
import zlib


def random_move(observation: str, player_id: int) -> str:
    """One of the moves the game lists as available, picked at random."""
    listed = observation.rsplit("Available Moves:", 1)[-1]
    moves = re.findall(r"\[\d+\]", listed)
    return random.Random(zlib.crc32(observation.encode())).choice(moves)

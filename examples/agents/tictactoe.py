"""A fixed TextArena opponent for two-player games (``env.options.opponent:
"examples/agents/tictactoe.py:random_move"`` with ``textarena:TicTacToe-v0``): a random legal
move (deterministic in the position, so a game is reproducible from its seed)."""

from __future__ import annotations

import random
import re
import zlib


def random_move(observation: str, player_id: int) -> str:
    """One of the moves the game lists as available, picked at random."""
    listed = observation.rsplit("Available Moves:", 1)[-1]
    moves = re.findall(r"\[\d+\]", listed)
    return random.Random(zlib.crc32(observation.encode())).choice(moves)

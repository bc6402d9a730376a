"""Fixed TextArena opponents for the tests (imported by name, also in worker processes)."""

from __future__ import annotations

import re


def first_free(observation: str, player_id: int) -> str:
    """The first of the moves the game lists as available."""
    listed = observation.rsplit("Available Moves:", 1)[-1]
    return re.findall(r"\[\d+\]", listed)[0]

"""``textarena:<game>``: a single-player TextArena game as a multi-turn text environment.

``textarena:GuessTheNumber-v0`` plays TextArena's own game (``textarena.make``) on its raw
observations (the ``-raw`` registration: no observation or action wrappers, so each turn
carries only what is new): ``reset`` starts the game with the reset seed and shows the
game's opening text as the user message; each model turn is the player's move as it is
(games read their own action format, e.g. ``[12]``); the game's answer (hints, invalid-move
notices) is the next user message. When the game ends, TextArena's reward for player 0 is
the turn's reward and the episode terminates.

Why TextArena (over gem-llm and skyrl-gym): it installs beside the workspace's pins with no
conflict (its dependencies are openai, rich, nltk, chess, python-dotenv, requests and
websockets; no torch or numpy pin), its single-player games run offline, and it is the
collection the others port games from. Games for two or more players need opponents and
are refused with a clear error.

    env:
      name: "textarena:GuessTheNumber-v0"
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rl_core.text_env import EnvOutputError, EnvReset, ModelTurn, TextEnv, TextEnvStep

__all__ = ["TextArenaEnv", "make_textarena_env"]

PLAYER = 0


def _textarena() -> Any:
    try:
        import textarena
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "textarena: games need textarena: pip install 'rl-rollout[textarena]'"
        ) from exc
    return textarena


class TextArenaEnv(TextEnv):
    """One TextArena game, player 0 played by the model (see the module docstring).

    game: a TextArena id (``GuessTheNumber-v0``; a ``-raw`` suffix is added when the game
    has one). system_prompt: an optional system message before the game's opening text."""

    def __init__(self, game: str, system_prompt: str | None = None) -> None:
        ta = _textarena()
        from textarena.envs.registration import ENV_REGISTRY

        if game not in ENV_REGISTRY:
            from rl_core.config import did_you_mean

            single = sorted(n for n in ENV_REGISTRY if not n.endswith(("-raw", "-train")))
            raise ValueError(
                f"textarena: no game {game!r}{did_you_mean(game, single)}; TextArena has "
                f"{len(single)} (e.g. GuessTheNumber-v0, Hangman-v0, Mastermind-v0)"
            )
        raw = game if game.endswith("-raw") else f"{game}-raw"
        self.game = game
        self.name = f"textarena:{game}"
        self._env = ta.make(raw if raw in ENV_REGISTRY else game)
        self.system_prompt = system_prompt
        self._turn = 0

    def reset(self, task: Mapping[str, Any], seed: int) -> EnvReset:
        self._turn = 0
        try:
            self._env.reset(num_players=1, seed=int(seed))
        except (ValueError, AssertionError, TypeError) as exc:
            raise ValueError(
                f"textarena: {self.game!r} does not start with one player ({exc}); only "
                "single-player games are supported"
            ) from None
        text = self._observation_text()
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": text})
        return EnvReset(messages)

    def step(self, turn: ModelTurn) -> TextEnvStep:
        self._turn = turn.turn
        done, _ = self._env.step(turn.text)
        if not done:
            return TextEnvStep([{"role": "user", "content": self._observation_text()}], 0.0)
        self._observation_text(allow_empty=True)  # drain the game's last messages
        rewards, game_info = self._env.close()
        reward = (rewards or {}).get(PLAYER)
        if not isinstance(reward, int | float) or not math.isfinite(reward):
            raise EnvOutputError(
                self.name,
                turn.turn,
                f"rewards is {rewards!r}: expected a finite number for player 0",
            )
        info = (game_info or {}).get(PLAYER) or {}
        return TextEnvStep([], float(reward), terminated=True, info={"game": dict(info)})

    def _observation_text(self, allow_empty: bool = False) -> str:
        """What the game said since the model's last move (its own move echo left out)."""
        player, items = self._env.get_observation()
        if player != PLAYER:
            raise EnvOutputError(
                self.name, self._turn, f"the game asks player {player}: expected player 0"
            )
        parts = [str(item[1]) for item in items or [] if item[0] != PLAYER]
        text = "\n".join(p.strip() for p in parts if p.strip())
        if not text and not allow_empty:
            raise EnvOutputError(self.name, self._turn, "the game said nothing: expected its text")
        return text


def make_textarena_env(game: str, **options: Any) -> TextArenaEnv:
    """The ``textarena`` prefix's factory: ``textarena:<game>``."""
    return TextArenaEnv(game, **options)

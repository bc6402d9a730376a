"""``textarena:<game>``: a TextArena game as a multi-turn text environment.

``textarena:GuessTheNumber-v0`` plays TextArena's own game (``textarena.make``) on its raw
observations (the ``-raw`` registration: no observation or action wrappers, so each turn
carries only what is new): ``reset`` starts the game with the reset seed and shows the
game's opening text as the user message; each model turn is the player's move as it is
(games read their own action format, e.g. ``[12]``); the game's answer (hints, invalid-move
notices, the opponent's move) is the next user message. When the game ends, TextArena's
reward for the policy's seat is the turn's reward and the episode terminates.

Two-player games (``TicTacToe-v0``, ``ConnectFour-v0``, ...) need ``opponent``:

* ``opponent: "package.module:function"`` (or ``"path/file.py:function"``): a fixed opponent, ``function(observation: str,
  player_id: int) -> str`` (its move), played inside the environment between the policy's
  turns. ``seat`` is the policy's seat (0 or 1; null: the reset seed's parity, so both seats
  are learned).
* ``opponent: "self"``: self-play, both seats are the policy. The episode runs as an agent
  (``run_agent``, `rl_rollout.envs.agent`): each seat keeps its own conversation with the
  policy server; the calls of the seat being trained (``seat``, or the seed's parity) are
  the episode's row, the other seat's calls are sent with ``user: "opponent"`` and recorded
  but not trained (`rl_rollout.server`); the reward is the trained seat's.

Why TextArena (over gem-llm and skyrl-gym): it installs beside the workspace's pins with no
conflict (its dependencies are openai, rich, nltk, chess, python-dotenv, requests and
websockets; no torch or numpy pin), its games run offline, and it is the collection the
others port games from.

    env:
      name: "textarena:TicTacToe-v0"
      options: {opponent: "my_pkg.players:first_free"}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
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


def _opponent(ref: str) -> Callable[[str, int], str]:
    from rl_rollout.envs.agent import _load

    module, sep, attr = str(ref).rpartition(":")
    try:
        found = getattr(_load(module), attr) if sep and module else None
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"textarena: opponent {ref!r} cannot be imported: {exc}") from None
    if not callable(found):
        raise ValueError(
            f"textarena: opponent {ref!r}: expected 'self' or 'package.module:function' "
            "(function(observation, player_id) -> move)"
        )
    return found


class TextArenaEnv(TextEnv):
    """One TextArena game, a seat played by the model (see the module docstring).

    game: a TextArena id (``GuessTheNumber-v0``; a ``-raw`` suffix is added when the game
    has one). system_prompt: an optional system message before the game's opening text.
    opponent: None (single-player games), "self" or "package.module:function" (two-player
    games). seat: the policy's seat in a two-player game (null: the reset seed's parity)."""

    def __init__(
        self,
        game: str,
        system_prompt: str | None = None,
        opponent: str | None = None,
        seat: int | None = None,
    ) -> None:
        ta = _textarena()
        from textarena.envs.registration import ENV_REGISTRY

        if game not in ENV_REGISTRY:
            from rl_core.config import did_you_mean

            single = sorted(n for n in ENV_REGISTRY if not n.endswith(("-raw", "-train")))
            raise ValueError(
                f"textarena: no game {game!r}{did_you_mean(game, single)}; TextArena has "
                f"{len(single)} (e.g. GuessTheNumber-v0, Hangman-v0, Mastermind-v0)"
            )
        if seat not in (None, 0, 1):
            raise ValueError(f"textarena: seat is {seat!r}, expected 0, 1 or null")
        raw = game if game.endswith("-raw") else f"{game}-raw"
        self.game = game
        self.name = f"textarena:{game}"
        self._env = ta.make(raw if raw in ENV_REGISTRY else game)
        self.system_prompt = system_prompt
        self.players = 1 if opponent is None else 2
        self.seat = seat
        self.opponent = None if opponent in (None, "self") else _opponent(opponent)
        if opponent == "self":
            self.run_agent = self._self_play  # both seats: the policy, through its server
        self._turn = 0
        self._learner = PLAYER
        self._pending: Any = None  # the policy's observation, read while the opponent moved

    # ------------------------------------------------------------------ one seat
    def _start(self, seed: int) -> None:
        try:
            self._env.reset(num_players=self.players, seed=int(seed))
        except (ValueError, AssertionError, TypeError) as exc:
            need = "one player (give `opponent` for two)" if self.players == 1 else "two players"
            raise ValueError(
                f"textarena: {self.game!r} does not start with {self.players} player(s) ({exc}); "
                f"expected a game for {need}"
            ) from None
        self._learner = (
            (int(seed) % 2 if self.seat is None else self.seat) if self.players == 2 else 0
        )

    def reset(self, task: Mapping[str, Any], seed: int) -> EnvReset:
        self._turn = 0
        self._start(seed)
        done = self._opponent_moves()
        if done:
            raise EnvOutputError(self.name, 0, "the game ended before the policy's first move")
        text = self._observation_text()
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": text})
        return EnvReset(messages, {"seat": self._learner})

    def step(self, turn: ModelTurn) -> TextEnvStep:
        self._turn = turn.turn
        done, _ = self._env.step(turn.text)
        if not done:
            done = self._opponent_moves()
        if not done:
            return TextEnvStep([{"role": "user", "content": self._observation_text()}], 0.0)
        self._observation_text(allow_empty=True)  # drain the game's last messages
        reward, info = self._final(turn.turn)
        return TextEnvStep([], reward, terminated=True, info={"game": info})

    def _opponent_moves(self) -> bool:
        """The fixed opponent plays until it is the policy's turn; True when the game ended."""
        done = False
        while self.players == 2 and not done:
            player, items = self._env.get_observation()
            if player == self._learner:
                self._pending = items
                return False
            if self.opponent is None:
                raise EnvOutputError(self.name, self._turn, "a two-player game needs an opponent")
            move = self.opponent(_text(items, player), player)
            done, _ = self._env.step(str(move))
        return done

    def _final(self, turn: int) -> tuple[float, dict[str, Any]]:
        rewards, game_info = self._env.close()
        reward = (rewards or {}).get(self._learner)
        if not isinstance(reward, int | float) or not math.isfinite(reward):
            raise EnvOutputError(
                self.name,
                turn,
                f"rewards is {rewards!r}: expected a finite number for player {self._learner}",
            )
        return float(reward), dict((game_info or {}).get(self._learner) or {})

    def _observation_text(self, allow_empty: bool = False) -> str:
        """What the game said since the model's last move (its own move echo left out)."""
        items = getattr(self, "_pending", None)
        self._pending = None
        if items is None:
            player, items = self._env.get_observation()
            if player != self._learner and not allow_empty:
                raise EnvOutputError(
                    self.name,
                    self._turn,
                    f"the game asks player {player}: expected player {self._learner}",
                )
        text = _text(items, self._learner)
        if not text and not allow_empty:
            raise EnvOutputError(self.name, self._turn, "the game said nothing: expected its text")
        return text

    # ------------------------------------------------------------------ self-play
    async def _self_play(
        self, task: Mapping[str, Any], seed: int, base_url: str, api_key: str
    ) -> dict[str, Any]:
        """Both seats are the policy (module docstring); returns the trained seat's reward."""
        import openai

        self._turn = 0
        self._start(seed)
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        first = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        chats: dict[int, list[dict[str, Any]]] = {0: list(first), 1: list(first)}
        try:
            done = False
            while not done:
                player, items = self._env.get_observation()
                chats[player].append({"role": "user", "content": _text(items, player)})
                extra = {} if player == self._learner else {"user": "opponent"}
                reply = await client.chat.completions.create(
                    model="policy", messages=chats[player], **extra
                )
                move = reply.choices[0].message.content or ""
                chats[player].append({"role": "assistant", "content": move})
                self._turn += 1
                done, _ = self._env.step(move)
        finally:
            await client.close()
        reward, info = self._final(self._turn)
        return {"reward": reward, "seat": self._learner, "game": info}


def _text(items: Any, player: int) -> str:
    """A player's observation items as text, its own move echo left out."""
    parts = [str(item[1]) for item in items or [] if item[0] != player]
    return "\n".join(p.strip() for p in parts if p.strip())


def make_textarena_env(game: str, **options: Any) -> TextArenaEnv:
    """The ``textarena`` prefix's factory: ``textarena:<game>``."""
    return TextArenaEnv(game, **options)

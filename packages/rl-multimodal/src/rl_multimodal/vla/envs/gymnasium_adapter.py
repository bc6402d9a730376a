"""Any ``gymnasium.Env`` (or a list of them) or ``gymnasium.vector.VectorEnv`` as a `VectorEnv`.

Per environment: the RGB image is ``obs[key]`` for the first of `IMAGE_KEYS` in a dict
observation, else ``env.render()`` (``render_mode="rgb_array"``), resized to ``image_size``
(square, bilinear) when given; proprio ``obs[key]`` for the first of `PROPRIO_KEYS`, a plain
array observation flattened, else none (``P = 0``); the instruction ``info["instruction"]``
or ``info["task_description"]`` at reset, the unwrapped env's ``instruction``, else the
adapter's; success ``info["is_success"]`` or ``info["success"]``, sticky in an episode.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rl_core.env import ActionSpec, EnvObservation, EnvStep, check_action_chunk

__all__ = ["IMAGE_KEYS", "PROPRIO_KEYS", "GymnasiumVectorEnv"]

IMAGE_KEYS = ("pixels", "image", "rgb", "observation.image", "agentview_image")
PROPRIO_KEYS = ("agent_pos", "proprio", "state", "observation.state", "robot_state")
SUCCESS_KEYS = ("is_success", "success")


def _resize(image: np.ndarray, size: int | None) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8:
        image = np.clip(image * (255.0 if image.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)
    if image.ndim == 3 and image.shape[0] == 3 and image.shape[-1] != 3:
        image = np.transpose(image, (1, 2, 0))  # CHW -> HWC
    if size is None or image.shape[:2] == (size, size):
        return image
    from PIL import Image

    return np.asarray(Image.fromarray(image).resize((size, size), Image.BILINEAR))


def _success(info: dict[str, Any], index: int | None = None) -> bool:
    for key in SUCCESS_KEYS:
        if key in info:
            value = info[key]
            if index is not None:
                mask = info.get(f"_{key}")
                if mask is not None and not bool(np.asarray(mask)[index]):
                    return False
                value = np.asarray(value)[index]
            return bool(value)
    return False


class GymnasiumVectorEnv:
    """A `rl_core.env.VectorEnv` over Gymnasium environments (see the module docstring).

    `envs` is one ``gymnasium.vector.VectorEnv``, or a sequence of ``gymnasium.Env`` or of
    callables that build one (then the envs are built here, in this process).
    """

    def __init__(
        self,
        envs: Any,
        instruction: str | None = None,
        image_size: int | None = None,
        max_chunk: int = 8,
    ):
        try:
            import gymnasium
        except ImportError as exc:  # pragma: no cover - the extra is in the dev env
            hint = "the Gymnasium adapter needs gymnasium: install rl-multimodal[vla]"
            raise ImportError(hint) from exc
        self._vector = isinstance(envs, gymnasium.vector.VectorEnv)
        if self._vector:
            self.envs: list[Any] = []
            self.vec = envs
            self.num_envs = int(envs.num_envs)
            space = envs.single_action_space
        else:
            if isinstance(envs, gymnasium.Env):
                envs = [envs]
            built = [
                e() if isinstance(e, Callable) and not isinstance(e, gymnasium.Env) else e
                for e in envs
            ]
            if not built:
                raise ValueError("envs: empty, expected at least one gymnasium.Env")
            for i, env in enumerate(built):
                if not isinstance(env, gymnasium.Env):
                    raise TypeError(f"envs[{i}]: {type(env).__name__}, expected a gymnasium.Env")
            self.envs = built
            self.num_envs = len(built)
            space = built[0].action_space
        if not isinstance(space, gymnasium.spaces.Box):
            raise TypeError(
                f"action space {space}: expected a gymnasium.spaces.Box (continuous); wrap "
                "discrete envs so their actions are a Box"
            )
        self.action_spec = ActionSpec(space.low, space.high, max_chunk=max_chunk)
        self._action_shape = space.shape
        self.default_instruction = instruction
        self.image_size = image_size
        self._last: EnvObservation | None = None
        self._done = np.zeros(self.num_envs, dtype=bool)
        self._terminated = np.zeros(self.num_envs, dtype=bool)
        self._truncated = np.zeros(self.num_envs, dtype=bool)
        self._success = np.zeros(self.num_envs, dtype=bool)
        self._instructions = [instruction or "" for _ in range(self.num_envs)]

    def _instruction(self, env: Any, info: dict[str, Any], i: int) -> str:
        for key in ("instruction", "task_description"):
            if key in info:
                value = info[key]
                return str(value[i] if self._vector else value)
        text = getattr(getattr(env, "unwrapped", env), "instruction", None)  # env may be None
        if text:
            return str(text)
        if self.default_instruction:
            return self.default_instruction
        spec = getattr(env, "spec", None)
        return f"solve {spec.id}" if spec is not None else "solve the task"

    def _parse(self, obs: Any, frame: Callable[[], Any]) -> tuple[np.ndarray, np.ndarray]:
        image = proprio = None
        if isinstance(obs, dict):
            image = next((obs[k] for k in IMAGE_KEYS if k in obs), None)
            proprio = next((obs[k] for k in PROPRIO_KEYS if k in obs), None)
        elif isinstance(obs, np.ndarray) and obs.ndim == 3 and obs.dtype == np.uint8:
            image = obs
        else:
            proprio = obs
        if image is None:
            image = frame()
            if image is None:
                raise ValueError(
                    "the env gave no image: its observation has none of "
                    f"{IMAGE_KEYS} and render() returned None (make it with "
                    "render_mode='rgb_array')"
                )
        p = np.zeros(0, np.float32) if proprio is None else np.asarray(proprio, np.float32)
        return _resize(image, self.image_size), p.reshape(-1)

    def _single_obs(self, obs: Any, i: int) -> Any:
        if isinstance(obs, dict):
            return {k: np.asarray(v)[i] for k, v in obs.items()}
        return np.asarray(obs)[i]

    def _parse_vector(self, obs: Any, which: np.ndarray) -> dict[int, tuple[np.ndarray, ...]]:
        render = functools.cache(self.vec.render)  # one render for every env, when needed

        def frame(i: int) -> Any:
            frames = render()
            return None if frames is None else frames[i]

        return {
            int(i): self._parse(self._single_obs(obs, int(i)), lambda i=int(i): frame(i))
            for i in np.flatnonzero(which)
        }

    def _assemble(self, parsed: dict[int, tuple[np.ndarray, ...]]) -> EnvObservation:
        """Per-env observations: `parsed` where given, else the last observation."""
        last = self._last  # None only at the first reset, where `parsed` has every env
        rows = [parsed.get(i) or (last.images[i], last.proprio[i]) for i in range(self.num_envs)]
        images, proprios = zip(*rows, strict=True)
        return EnvObservation(np.stack(images), np.stack(proprios), list(self._instructions))

    def reset(self, seeds: Sequence[int]) -> EnvObservation:
        seeds = [int(s) for s in seeds]
        if len(seeds) != self.num_envs:
            raise ValueError(f"seeds: {len(seeds)} values, expected {self.num_envs}")
        self._done[:] = self._terminated[:] = self._truncated[:] = self._success[:] = False
        if self._vector:
            obs, info = self.vec.reset(seed=seeds)
            self._instructions = [self._instruction(None, info, i) for i in range(self.num_envs)]
            parsed = self._parse_vector(obs, np.ones(self.num_envs, dtype=bool))
        else:
            pairs = [env.reset(seed=s) for env, s in zip(self.envs, seeds, strict=True)]
            self._instructions = [
                self._instruction(env, p[1], i) for i, (env, p) in enumerate(zip(self.envs, pairs))
            ]
            parsed = {
                i: self._parse(p[0], e.render) for i, (p, e) in enumerate(zip(pairs, self.envs))
            }
        self._last = self._assemble(parsed)
        return self._last

    def step(self, actions: np.ndarray) -> EnvStep:
        if self._last is None:
            raise RuntimeError("step() before reset(): call reset(seeds) first")
        chunk = check_action_chunk(actions, self.action_spec, self.num_envs)
        reward = np.zeros(self.num_envs, np.float32)
        parsed: dict[int, tuple[np.ndarray, ...]] = {}
        raw: dict[int, Any] = {}
        for t in range(chunk.shape[1]):
            active = ~self._done
            if not active.any():
                break
            if self._vector:
                batch = chunk[:, t].reshape((self.num_envs, *self._action_shape))
                obs, r, term, trunc, info = self.vec.step(batch)
                for i in np.flatnonzero(active):
                    self._record(i, float(r[i]), bool(term[i]), bool(trunc[i]), _success(info, i))
                    reward[i] += float(r[i])
                # parse now: a finished env is auto-reset by the vector env at its next step
                parsed.update(self._parse_vector(obs, active))
            else:
                for i in np.flatnonzero(active):
                    action = chunk[i, t].reshape(self._action_shape)
                    o, r, term, trunc, info = self.envs[i].step(action)
                    self._record(i, float(r), bool(term), bool(trunc), _success(info))
                    reward[i] += float(r)
                    raw[int(i)] = o  # parsed once, after the chunk (no auto-reset here)
        for i, o in raw.items():
            parsed[i] = self._parse(o, self.envs[i].render)
        self._last = self._assemble(parsed)
        return EnvStep(
            self._last,
            reward,
            self._terminated.copy(),
            self._truncated.copy(),
            {"success": self._success.copy()},
        )

    def _record(self, i: int, r: float, term: bool, trunc: bool, ok: bool) -> None:
        self._success[i] |= ok
        self._terminated[i] |= term
        self._truncated[i] |= trunc
        self._done[i] = self._terminated[i] or self._truncated[i]

    def close(self) -> None:
        if self._vector:
            self.vec.close()
        for env in self.envs:
            env.close()

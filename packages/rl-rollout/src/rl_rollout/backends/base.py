"""`BackendEngine`: what every rollout backend of this package checks before it generates.

`generate` refuses a shut-down engine, validates the sampling parameters, checks the prompt
against the context length and vocabulary and the stop tokens against the vocabulary, then
hands the checked request to the backend's ``_generate``. A backend sets ``name``,
``_max_model_len`` and ``vocab_size`` when it starts and ``_closed`` when it shuts down.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

from rl_core.rollout import (
    GenerationOutput,
    RolloutEngine,
    SamplingParams,
    check_prompt,
    check_stop_token_ids,
)

__all__ = ["BackendEngine"]


class BackendEngine(RolloutEngine):
    """A `RolloutEngine` whose requests are checked once, here (see the module docstring)."""

    name: ClassVar[str]  # the engine's registered name, for messages
    _max_model_len: int
    vocab_size: int
    _closed: bool = False

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: SamplingParams,
        request_id: str,
        multi_modal_data: dict[str, Any] | None = None,
    ) -> list[GenerationOutput]:
        self._check_ready()
        params = sampling_params.validate()
        prompt = check_prompt(prompt_ids, self._max_model_len, self.vocab_size)
        check_stop_token_ids(params.stop_token_ids, self.vocab_size)
        return await self._generate(prompt, params, request_id, multi_modal_data)

    def _check_ready(self) -> None:
        """Raise when the engine cannot take requests (it was shut down)."""
        if self._closed:
            raise RuntimeError(f"the {self.name!r} rollout engine was shut down")

    @abstractmethod
    async def _generate(
        self,
        prompt: list[int],
        params: SamplingParams,
        request_id: str,
        multi_modal_data: dict[str, Any] | None,
    ) -> list[GenerationOutput]:
        """`generate` for a checked request: ``prompt`` fits the context and vocabulary,
        ``params`` are validated."""

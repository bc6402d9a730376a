"""`BackendEngine`: what every rollout backend of this package checks before it generates.

`generate` refuses a shut-down engine, validates the sampling parameters, checks the prompt
against the context length and vocabulary and the stop tokens against the vocabulary, then
hands the checked request to the backend's ``_generate``. A backend sets ``name``,
``_max_model_len`` and ``vocab_size`` when it starts and ``_closed`` when it shuts down.
"""

from __future__ import annotations

import importlib
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from rl_core.rollout import (
    GenerationOutput,
    RolloutConfig,
    RolloutEngine,
    SamplingParams,
    check_prompt,
    check_stop_token_ids,
)
from rl_rollout.backends.options import OptionsT
from rl_rollout.backends.routed_experts import check_moe_model

__all__ = ["BackendEngine", "CheckedRequest"]


@dataclass(frozen=True)
class CheckedRequest:
    """A `generate` request after the checks: ``prompt`` (a list of ints) fits the context
    length and vocabulary, ``params`` are validated and their stop tokens in the
    vocabulary."""

    prompt: list[int]
    params: SamplingParams
    request_id: str
    multi_modal_data: dict[str, Any] | None


class BackendEngine(RolloutEngine):
    """A `RolloutEngine` whose requests are checked once, here (see the module docstring)."""

    name: ClassVar[str]  # the engine's registered name, for messages
    _max_model_len: int
    vocab_size: int
    _closed: bool = False

    def _import_library(self, module: str, library: str, install: str) -> Any:
        """``module`` imported, or an ImportError saying the engine needs ``library`` and
        how to install it."""
        try:
            return importlib.import_module(module)
        except ImportError as exc:
            raise ImportError(
                f"the {self.name!r} rollout engine needs {library} ({exc}): {install}"
            ) from exc

    @classmethod
    def parse_options(cls, config: RolloutConfig) -> Any:
        """The typed options; a server engine's (`from_kwargs`) pass the keys they do not
        declare on to the library."""
        from_kwargs = getattr(cls.options_class, "from_kwargs", None)
        if from_kwargs is not None:
            return from_kwargs(config.engine_kwargs)
        return super().parse_options(config)

    def _server_options(self, config: RolloutConfig, options_type: type[OptionsT]) -> OptionsT:
        """Validate and keep ``config``; parse its ``engine_kwargs`` as ``options_type`` and
        keep the weight-update options every server engine has."""
        config.validate()
        self.config = config
        options = options_type.from_kwargs(config.engine_kwargs)
        self._bucket_bytes = options.weight_bucket_bytes
        self._update_timeout_s = float(options.update_timeout_s)
        if config.return_routed_experts:
            check_moe_model(config.model_path)
        return options

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
        return await self._generate(CheckedRequest(prompt, params, request_id, multi_modal_data))

    def _check_ready(self) -> None:
        """Raise when the engine cannot take requests (it was shut down)."""
        if self._closed:
            raise RuntimeError(f"the {self.name!r} rollout engine was shut down")

    @abstractmethod
    async def _generate(self, request: CheckedRequest) -> list[GenerationOutput]:
        """`generate` for a checked request."""

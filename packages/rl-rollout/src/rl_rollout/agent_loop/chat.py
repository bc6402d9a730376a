"""Chat-template arithmetic for token-in/token-out multi-turn loops.

The model's own tokens are never re-tokenised. Between turns the loop appends only the tokens
the chat template would render *after* the assistant's content: the end of the assistant
turn the model did not generate itself (e.g. the newline after ``<|im_end|>``) and the new
messages (tool results) with the next generation prompt. Both come from rendering a fixed
reference conversation with and without the new messages and taking the difference, so the
stream equals what the template renders for the whole conversation whenever the model
tokenises its own text canonically, and never drifts from what the model actually saw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ChatTemplate"]

_USER = "rl-chat-reference-user"
_ASSISTANT = "rl-chat-reference-assistant"


class ChatTemplate:
    """A tokenizer's chat template with the delta operations the loops need."""

    def __init__(
        self,
        tokenizer: Any,
        tool_schemas: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"tokenizer {type(tokenizer).__name__} has no chat_template: multi-turn loops "
                "need one to render tool messages"
            )
        self.tokenizer = tokenizer
        self.tool_schemas = [dict(s) for s in tool_schemas] if tool_schemas else None
        self.template_kwargs = dict(template_kwargs or {})
        self._reference = [
            {"role": "user", "content": _USER},
            {"role": "assistant", "content": _ASSISTANT},
        ]
        self._reference_text = self._render(self._reference, add_generation_prompt=False)
        if _ASSISTANT not in self._reference_text:
            raise ValueError("the chat template does not render assistant message content")
        cut = self._reference_text.rindex(_ASSISTANT) + len(_ASSISTANT)
        self.assistant_close_ids = self.encode_text(self._reference_text[cut:])

    def _render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool, **kw: Any
    ) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
            **kw,
        )

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def encode(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Prompt ids of a conversation, with the tools' schemas and the generation prompt."""
        text = self._render(
            [dict(m) for m in messages], add_generation_prompt=True, tools=self.tool_schemas
        )
        return self.encode_text(text)

    def close_ids(self, generated: Sequence[int]) -> list[int]:
        """The end-of-assistant-turn tokens the model did not generate itself.

        If the generation ends with a prefix of the template's closing tokens (typically the
        end-of-turn token it stopped at), only the rest is returned.
        """
        close = self.assistant_close_ids
        for k in range(min(len(close), len(generated)), 0, -1):
            if list(generated[-k:]) == close[:k]:
                return close[k:]
        return list(close)

    def message_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Tokens of `messages` (tool results, user turns) following an assistant turn, up to
        and including the next generation prompt."""
        full = self._render(
            [*self._reference, *(dict(m) for m in messages)], add_generation_prompt=True
        )
        if not full.startswith(self._reference_text):
            raise ValueError(
                "the chat template renders earlier messages differently once new ones follow; "
                "tool messages cannot be appended token-in/token-out with it"
            )
        return self.encode_text(full[len(self._reference_text) :])

"""Chat messages to prompt token ids: the checkpoint's chat template, or a plain one.

A checkpoint whose `tokenizer_config.json` has a `chat_template` (a Jinja template, or a
list of named ones, of which "default" is used) is rendered with jinja2 in a sandbox, as
transformers' `apply_chat_template` does, with `messages`, `add_generation_prompt=True`,
`bos_token` and `eos_token`; the rendered text already holds whatever special tokens the
template writes, so it is encoded without adding more.

A checkpoint with no template (the embedded Shakespeare model has none) gets the plain
template, which writes each message as a speech heading the way the model's training text
does, a blank line between messages, and ends with the assistant's heading:

    SYSTEM:
    You are a poet.

    USER:
    Say something.

    ASSISTANT:

The plain text is encoded like any prompt (with the tokenizer's BOS, as in training).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmengine.model.tokenizer import read_tokenizer_config


def chat_template_of(folder: Path, tokenizer: Any = None) -> str | None:
    """The chat template a checkpoint folder (or a transformers tokenizer) carries, if any."""
    template = read_tokenizer_config(folder).get("chat_template")
    if template is None:
        template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template}
        template = named.get("default")
    return template if isinstance(template, str) and template else None


def plain_prompt(messages: Sequence[tuple[str, str]]) -> str:
    """The plain template: `ROLE:` headings, a blank line between, the assistant's to end."""
    turns = [f"{role.upper()}:\n{content}\n\n" for role, content in messages]
    return "".join(turns) + "ASSISTANT:\n"


class ChatFormatter:
    """Renders a conversation to prompt token ids with one tokenizer and template."""

    def __init__(self, tokenizer: Any, template: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.template_source = template
        self._template = None
        if template is not None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            environment.globals["raise_exception"] = _raise_exception
            self._template = environment.from_string(template)

    def token_ids(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        """The prompt of `messages` (role, text pairs), ready for the engine.

        ValueError when the template refuses them (its `raise_exception`) or fails.
        """
        if self._template is None:
            return list(self.tokenizer.encode(plain_prompt(messages)))
        from jinja2 import TemplateError

        try:
            text = self._template.render(
                messages=[{"role": role, "content": content} for role, content in messages],
                add_generation_prompt=True,
                bos_token=getattr(self.tokenizer, "bos_token", None) or "",
                eos_token=getattr(self.tokenizer, "eos_token", None) or "",
            )
        except TemplateError as error:
            raise ValueError(f"the chat template failed: {error}") from None
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def _raise_exception(message: str) -> None:
    """What chat templates call to refuse a conversation (becomes a 400)."""
    raise ValueError(message)

"""Chat messages to prompt token ids: the checkpoint's chat template, or a plain one.

A checkpoint whose `tokenizer_config.json` has a `chat_template` (a Jinja template, or a
list of named ones, of which "default" is used) is rendered with jinja2 in a sandbox, as
transformers' `apply_chat_template` does, with `messages`, `tools` (when the request has
them), `add_generation_prompt=True`, `bos_token` and `eos_token`; the rendered text already
holds whatever special tokens the template writes, so it is encoded without adding more. A
tool call's `arguments`, JSON text in OpenAI's messages, reaches the template as the object
it spells (as vLLM hands it over): templates such as Llama 3's write it with `tojson`.

A checkpoint with no template (the embedded Shakespeare model has none) gets the plain
template, which writes each message as a speech heading the way the model's training text
does, a blank line between messages, and ends with the assistant's heading:

    SYSTEM:
    You are a poet.

    USER:
    Say something.

    ASSISTANT:

An assistant message's tool calls follow its text, one JSON object per line
(`{"name": ..., "arguments": ...}`), and a tool's answer is a `TOOL:` speech. The plain text
is encoded like any prompt (with the tokenizer's BOS, as in training).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
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


Message = tuple[str, str] | Mapping[str, Any]  # (role, text), or a message's fields


def message_fields(message: Message) -> dict[str, Any]:
    """A message as a dict with at least `role` and `content`."""
    if isinstance(message, tuple):
        role, content = message
        return {"role": role, "content": content}
    return dict(message)


def plain_prompt(messages: Sequence[Message]) -> str:
    """The plain template: `ROLE:` headings, a blank line between, the assistant's to end."""
    turns = []
    for message in map(message_fields, messages):
        calls = [
            json.dumps(
                {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}
            )
            for call in message.get("tool_calls") or ()
        ]
        text = "\n".join(part for part in (message["content"], *calls) if part)
        turns.append(f"{message['role'].upper()}:\n{text}\n\n")
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

    def token_ids(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """The prompt of `messages` ((role, text) pairs or message dicts) and the request's
        `tools` (which only a checkpoint's own template shows the model), ready for the engine.

        ValueError when the template refuses them (its `raise_exception`) or fails.
        """
        if self._template is None:
            return list(self.tokenizer.encode(plain_prompt(messages)))
        from jinja2 import TemplateError

        try:
            text = self._template.render(
                messages=[_with_call_objects(message_fields(message)) for message in messages],
                tools=None if tools is None else list(tools),
                add_generation_prompt=True,
                bos_token=getattr(self.tokenizer, "bos_token", None) or "",
                eos_token=getattr(self.tokenizer, "eos_token", None) or "",
            )
        except TemplateError as error:
            raise ValueError(f"the chat template failed: {error}") from None
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def _with_call_objects(message: dict[str, Any]) -> dict[str, Any]:
    """The message with each tool call's JSON-text arguments parsed (left as text when they
    are not JSON: the template then shows what was sent)."""
    if not message.get("tool_calls"):
        return message
    calls = []
    for call in message["tool_calls"]:
        arguments = call["function"]["arguments"]
        if isinstance(arguments, str):
            with contextlib.suppress(json.JSONDecodeError):
                arguments = json.loads(arguments)
        calls.append({**call, "function": {**call["function"], "arguments": arguments}})
    return {**message, "tool_calls": calls}


def _raise_exception(message: str) -> None:
    """What chat templates call to refuse a conversation (becomes a 400)."""
    raise ValueError(message)

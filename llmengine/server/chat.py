"""Chat messages to prompt token ids: the checkpoint's chat template, or a plain one.

A checkpoint whose `tokenizer_config.json` has a `chat_template` (a Jinja template, or a
list of named ones: "tool_use" for a request with tools where there is one, else "default",
as transformers chooses) is rendered with jinja2 in a sandbox, as
transformers' `apply_chat_template` does, with `messages`, `tools` (when the request has
them), `add_generation_prompt` (true unless asked otherwise), `bos_token`, `eos_token` and
the request's `chat_template_kwargs`; the rendered text already holds whatever special
tokens the template writes, so it is encoded without adding more (unless
`add_special_tokens`). With `continue_final_message` the text is cut right after the last
message's content, as transformers does, so the model goes on with that message. A tool
call's `arguments`, JSON text in OpenAI's messages, reaches the template as the object it
spells (as vLLM hands it over): templates such as Llama 3's write it with `tojson`.

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
is encoded like any prompt (with the tokenizer's BOS, as in training, whatever
`add_special_tokens` says: this template writes it). Without `add_generation_prompt` the
assistant's heading is left out; with `continue_final_message` the last speech ends where
its text does. It reads no `chat_template_kwargs`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llmengine.model.tokenizer import read_tokenizer_config

# A checkpoint's chat template: one Jinja source, or named ones (a list in its config).
ChatTemplate = str | Mapping[str, str]


def chat_template_of(folder: Path, tokenizer: Any = None) -> ChatTemplate | None:
    """The chat template a checkpoint folder (or a transformers tokenizer) carries, if any:
    its source, or its named sources by name (Hermes' "default" and "tool_use", say)."""
    template = read_tokenizer_config(folder).get("chat_template")
    if template is None:
        template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template}
        return {name: source for name, source in named.items() if name and source} or None
    return template if isinstance(template, str) and template else None


Message = tuple[str, str] | Mapping[str, Any]  # (role, text), or a message's fields
# What the server itself passes to a template: `chat_template_kwargs` may not set these.
RESERVED_TEMPLATE_ARGS = frozenset(
    {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
)


def message_fields(message: Message) -> dict[str, Any]:
    """A message as a dict with at least `role` and `content`."""
    if isinstance(message, tuple):
        role, content = message
        return {"role": role, "content": content}
    return dict(message)


def plain_prompt(
    messages: Sequence[Message],
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> str:
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
    if continue_final_message:
        return "".join(turns).removesuffix("\n\n")
    return "".join(turns) + ("ASSISTANT:\n" if add_generation_prompt else "")


class ChatFormatter:
    """Renders a conversation to prompt token ids with one tokenizer and template."""

    def __init__(self, tokenizer: Any, template: ChatTemplate | None = None) -> None:
        """`template`: a Jinja source, named sources (a "default" one needed: with tools the
        "tool_use" one is rendered where there is one, as transformers chooses), or None for
        the plain template."""
        self.tokenizer = tokenizer
        self._templates: dict[str, Any] = {}
        if template is None:
            return
        named = {"default": template} if isinstance(template, str) else dict(template)
        if "default" not in named:
            raise ValueError(f"the chat templates {sorted(named)} have none named 'default'")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = _raise_exception
        self._templates = {name: environment.from_string(source) for name, source in named.items()}

    def token_ids(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: Mapping[str, Any] | None = None,
        add_special_tokens: bool = False,
    ) -> list[int]:
        """The prompt of `messages` ((role, text) pairs or message dicts) and the request's
        `tools` (which only a checkpoint's own template shows the model), ready for the engine.

        ValueError when the template refuses them (its `raise_exception`) or fails, or when
        the last message to continue is not in the rendered text.
        """
        if not self._templates:
            text = plain_prompt(messages, add_generation_prompt, continue_final_message)
            return list(self.tokenizer.encode(text))
        from jinja2 import TemplateError

        name = "tool_use" if tools is not None and "tool_use" in self._templates else "default"
        fields = [message_fields(message) for message in messages]
        try:
            text = self._templates[name].render(
                **(template_kwargs or {}),
                messages=[_with_call_objects(message) for message in fields],
                tools=None if tools is None else list(tools),
                add_generation_prompt=add_generation_prompt and not continue_final_message,
                bos_token=getattr(self.tokenizer, "bos_token", None) or "",
                eos_token=getattr(self.tokenizer, "eos_token", None) or "",
            )
        except (TemplateError, TypeError, KeyError, IndexError, AttributeError) as error:
            # A template is code that reads the request: what it trips on in a conversation
            # (a missing field, tools it expected) is the conversation's refusal, a 400.
            raise ValueError(f"the chat template failed: {error}") from None
        if continue_final_message:
            text = _cut_after(text, fields[-1].get("content") or "")
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))


def _cut_after(text: str, final: str) -> str:
    """`text` up to the end of its last occurrence of `final` (the message to continue), as
    transformers cuts it: the template may strip the message's surrounding spaces."""
    stripped = final.strip()
    if not stripped or stripped not in text:
        raise ValueError("continue_final_message: the chat template does not write the last "
                         "message's text, so there is nothing to continue")  # fmt: skip
    start = text.rindex(stripped)
    kept = final.lstrip()
    if text[start : start + len(kept)] == kept:
        return text[: start + len(kept)]
    return text[: start + len(stripped)]


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

"""A request's prompt fields to engine prompt token ids, and the text an echo starts with.

Completions encode a text prompt with the tokenizer's special tokens (its BOS) unless
`add_special_tokens` is false, and take token ids as they are. Chat renders the messages
through the formatter with the request's `add_generation_prompt`, `continue_final_message`,
`chat_template_kwargs` and `add_special_tokens`. Either way vLLM's `truncate_prompt_tokens`
keeps the prompt's last k tokens, and the usage counts what is left.
"""

from __future__ import annotations

from typing import Any

from llmengine.server.chat import ChatFormatter
from llmengine.server.protocol import ChatCompletionRequest


def truncated(prompt: list[int], keep: int | None) -> list[int]:
    """The last `keep` tokens of `prompt` (all of them when `keep` is None)."""
    return prompt if keep is None or len(prompt) <= keep else prompt[-keep:]


def completion_prompt(
    tokenizer: Any, prompt: str | list[int], add_special_tokens: bool, keep: int | None
) -> list[int]:
    """One completions prompt (a text or token ids) as the engine's token ids."""
    if isinstance(prompt, str):
        prompt = list(tokenizer.encode(prompt, add_special_tokens=add_special_tokens))
    return truncated(prompt, keep)


def chat_prompt(chat: ChatFormatter, body: ChatCompletionRequest) -> list[int]:
    """The conversation (and tools) of a chat request as the engine's token ids.

    ValueError when the chat template refuses it.
    """
    messages = [message.template_fields() for message in body.messages]
    tools = None if body.tools is None else [t.model_dump(exclude_none=True) for t in body.tools]
    prompt = chat.token_ids(
        messages,
        tools,
        add_generation_prompt=body.add_generation_prompt,
        continue_final_message=body.continue_final_message,
        template_kwargs=body.chat_template_kwargs,
        add_special_tokens=body.add_special_tokens,
    )
    return truncated(prompt, body.truncate_prompt_tokens)


def chat_echo(body: ChatCompletionRequest) -> str | None:
    """The text the reply starts with: with `echo`, the last message's when it is the
    assistant's (the one the reply goes on with); otherwise None."""
    last = body.messages[-1]
    return last.text if body.echo and last.role == "assistant" and last.text else None

"""A constrained output turned into OpenAI's `message.tool_calls`.

Under a named function the output is that function's arguments; under "required" it is a
list of `{"name", "arguments"}` objects (`llmengine.server.structured`). Either way the
grammar guarantees the JSON only if the output ended on its own: one cut short by
`max_tokens` is returned as text, with finish_reason "length". A stream holds a tool call's
text back and sends each call whole, in the choice's last chunk, since the arguments are
not JSON until then.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from llmengine.server.structured import NamedToolChoice


def tool_calls_of(text: str, tool_choice: Any) -> list[dict[str, Any]] | None:
    """The calls in a finished output, as `message.tool_calls`; None when `text` is not a
    whole call (its budget ran out first)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(tool_choice, NamedToolChoice):
        calls = [(tool_choice.function.name, text)]
    else:
        calls = [
            (call["name"], json.dumps(call["arguments"], ensure_ascii=False)) for call in value
        ]
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        for name, arguments in calls
    ]


def message_of(text: str, finish_reason: str | None, tool_choice: Any) -> tuple[dict, str | None]:
    """A finished tool-call choice's message and finish reason: the calls with "tool_calls",
    or the text as it is with the engine's reason when it holds no whole call."""
    calls = tool_calls_of(text, tool_choice) if finish_reason == "stop" else None
    if calls is None:
        return {"role": "assistant", "content": text}, finish_reason
    return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"


def stream_delta(message: dict[str, Any]) -> dict[str, Any]:
    """A finished message as a stream's last delta: each call with its index in the list."""
    if "tool_calls" not in message:
        return {"content": message["content"]} if message["content"] else {}
    return {"tool_calls": [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]}

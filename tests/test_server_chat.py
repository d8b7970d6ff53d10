"""Chat templates: the checkpoint's own (Jinja, from tokenizer_config.json) or the plain one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from server_helpers import MODEL_NAME, served

import llmengine
from llmengine.server.chat import ChatFormatter, chat_template_of, plain_prompt

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
    "[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)
MESSAGES = [("system", "Be brief."), ("user", "Who art thou?")]
RENDERED = "<|endoftext|>[system] Be brief.\n[user] Who art thou?\n[assistant] "


def checkpoint_config(folder: Path, config: dict[str, Any]) -> Path:
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_the_template_is_read_from_the_checkpoint_in_either_form(tmp_path: Path) -> None:
    assert chat_template_of(llmengine.embedded_model_path()) is None
    plain = checkpoint_config(tmp_path, {"chat_template": TEMPLATE})
    assert chat_template_of(plain) == TEMPLATE
    named = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": TEMPLATE}]
    assert chat_template_of(checkpoint_config(tmp_path, {"chat_template": named})) == {
        "tool_use": "x",
        "default": TEMPLATE,
    }


def test_with_tools_the_tool_use_template_is_rendered(tokenizer: Any) -> None:
    """Named templates render as transformers chooses: "tool_use" when the request has
    tools and the checkpoint has one, "default" otherwise; none named default is refused."""
    tool_use = "{{ tools | length }} tools:{% for m in messages %}{{ m.content }}{% endfor %}"
    formatter = ChatFormatter(tokenizer, {"default": TEMPLATE, "tool_use": tool_use})
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert tokenizer.decode(formatter.token_ids(MESSAGES, tools)).startswith("1 tools:")
    assert formatter.token_ids(MESSAGES) == ChatFormatter(tokenizer, TEMPLATE).token_ids(MESSAGES)
    with pytest.raises(ValueError, match="none named 'default'"):
        ChatFormatter(tokenizer, {"tool_use": tool_use})


def test_a_template_that_trips_on_a_conversation_refuses_it(tokenizer: Any) -> None:
    """A template that iterates tools the request did not send raises a TypeError inside
    Jinja: that is the conversation's refusal (ValueError, a 400), not a server fault."""
    formatter = ChatFormatter(tokenizer, "{% for tool in tools %}{{ tool }}{% endfor %}")
    with pytest.raises(ValueError, match="the chat template failed"):
        formatter.token_ids(MESSAGES)


def test_a_jinja_template_renders_with_the_special_tokens_and_adds_none(tokenizer: Any) -> None:
    formatter = ChatFormatter(tokenizer, TEMPLATE)
    ids = formatter.token_ids(MESSAGES)
    assert ids == tokenizer.encode(RENDERED, add_special_tokens=False)
    assert ids.count(tokenizer.bos_token_id) == 1
    with pytest.raises(ValueError, match="no tools here"):
        formatter.token_ids([("tool", "result")])


def test_the_plain_template_is_speech_headings_encoded_like_a_prompt(tokenizer: Any) -> None:
    assert plain_prompt(MESSAGES) == "SYSTEM:\nBe brief.\n\nUSER:\nWho art thou?\n\nASSISTANT:\n"
    ids = ChatFormatter(tokenizer).token_ids(MESSAGES)
    assert ids == tokenizer.encode(plain_prompt(MESSAGES))


def test_the_server_uses_the_template_it_is_given(tokenizer: Any) -> None:
    model = llmengine.load_model()
    engine = llmengine.Engine(model, num_blocks=16, block_size=16, num_slots=2)
    with served(engine, tokenizer, chat_template=TEMPLATE) as server:
        messages = [{"role": role, "content": content} for role, content in MESSAGES]
        body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 3, "temperature": 0}
        result = server.post("/v1/chat/completions", body).json()
        expected = llmengine.Engine(model, num_blocks=16, block_size=16).generate(
            [tokenizer.encode(RENDERED, add_special_tokens=False)],
            llmengine.SamplingParams(max_tokens=3),
        )[0]
        assert result["choices"][0]["message"]["content"] == tokenizer.decode(
            expected, skip_special_tokens=True
        )
        assert result["usage"]["prompt_tokens"] == len(
            tokenizer.encode(RENDERED, add_special_tokens=False)
        )
        refused = server.post(
            "/v1/chat/completions", {**body, "messages": [{"role": "tool", "content": "x"}]}
        )
        assert refused.status_code == 400
        assert "no tools here" in refused.json()["error"]["message"]

"""Request fields: the README's table against the request models, vLLM's extensions doing what
they say over HTTP, bookkeeping fields changing nothing, answer-changing ones refused by name,
integral floats as integers, `Allow` on a 405 and a clear limit on stop strings."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import MODEL_NAME, TIMEOUT, Served, served, sse_payloads

import llmengine
from llmengine.server.chat import ChatFormatter, plain_prompt
from llmengine.server.fields import REFUSED, UNUSED
from llmengine.server.protocol import ChatCompletionRequest, CompletionRequest, StreamOptions

README = Path(__file__).resolve().parents[1] / "README.md"
ROW = re.compile(r"^\| `([a-z_.]+)` \| (both|completions|chat) \| ([a-z, ]+) \| .+ \|$")
EOS = 0  # the embedded tokenizer's <|endoftext|>, its BOS and EOS


def field_table() -> dict[str, tuple[str, str]]:
    """The README's field table: name -> (endpoints, status)."""
    rows = [ROW.match(line) for line in README.read_text().splitlines()]
    table = {row[1]: (row[2], row[3]) for row in rows if row is not None}
    assert len(table) == sum(row is not None for row in rows), "a field listed twice"
    return table


def test_the_readme_field_table_is_the_request_models() -> None:
    table = field_table()
    stream_options = {f"stream_options.{name}" for name in StreamOptions.model_fields}
    for endpoint, model in (("completions", CompletionRequest), ("chat", ChatCompletionRequest)):
        listed = {name for name, (where, _) in table.items() if where in ("both", endpoint)}
        assert listed == set(model.model_fields) | stream_options, endpoint
    by_status = {
        status: {name for name, (_, s) in table.items() if s == status}
        for status in ("implemented", "accepted, unused", "refused")
    }
    assert sum(map(len, by_status.values())) == len(table), "a status outside the three"
    assert by_status["refused"] == set(REFUSED)
    assert by_status["accepted, unused"] == UNUSED


@pytest.fixture(scope="module")
def server(model: llmengine.Llama, tokenizer: Any) -> Iterator[Served]:
    engine = llmengine.Engine(model, num_blocks=96, block_size=16, num_slots=8, tokenizer=tokenizer)
    with served(engine, tokenizer) as running:
        yield running


def complete(server: Served, **fields: Any) -> dict[str, Any]:
    body = {"model": MODEL_NAME, "prompt": "ROMEO:", "max_tokens": 12, "temperature": 0}
    response = server.post("/v1/completions", {**body, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def streamed(server: Served, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream(
        "POST", f"{server.url}{path}", json={**body, "stream": True}, timeout=TIMEOUT
    ) as response:
        assert response.status_code == 200
        return sse_payloads(response.iter_lines())


def stream_text(server: Served, **fields: Any) -> str:
    body = {"model": MODEL_NAME, "prompt": "ROMEO:", "max_tokens": 12, "temperature": 0}
    chunks = streamed(server, "/v1/completions", {**body, **fields})
    return "".join(choice["text"] for chunk in chunks for choice in chunk["choices"])


def refusal(response: httpx.Response, param: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    return error["message"]


def test_integral_floats_are_integers_and_other_numbers_are_not(server: Served) -> None:
    answer = complete(server, n=63.0, max_tokens=1.0, seed=7.0, top_k=5.0)
    assert len(answer["choices"]) == 63
    for bad in ("2", 2.5, True):
        response = server.post("/v1/completions", {"prompt": "ROMEO:", "n": bad})
        refusal(response, "n")


def test_a_405_says_which_methods_the_path_allows(server: Served) -> None:
    response = httpx.get(f"{server.url}/v1/completions", timeout=TIMEOUT)
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert response.json()["error"]["message"]


def test_too_many_stop_strings_are_refused_with_the_limit(server: Served) -> None:
    stop = [f"s{i}" for i in range(17)]
    message = refusal(server.post("/v1/completions", {"prompt": "x", "stop": stop}), "stop")
    assert message.startswith("stop: at most 16 stop strings")
    complete(server, stop=stop[:16])


REFUSALS = [
    ("completions", {"best_of": 3}, {"best_of": 2, "n": 2}),
    ("completions", {"suffix": "the end"}, {"suffix": ""}),
    ("completions", {"use_beam_search": True}, {"use_beam_search": False}),
    ("completions", {"length_penalty": 0.5}, {"length_penalty": 1}),
    ("chat", {"functions": [{"name": "f"}]}, {"functions": []}),
    ("chat", {"function_call": "auto"}, {"function_call": None}),
    ("chat", {"audio": {"voice": "alloy", "format": "wav"}}, {"audio": None}),
    ("chat", {"modalities": ["text", "audio"]}, {"modalities": ["text"]}),
]


@pytest.mark.parametrize("endpoint, refused, neutral", REFUSALS, ids=lambda x: str(x)[:30])
def test_a_field_that_would_change_the_answer_is_refused_by_name_unless_it_asks_nothing(
    server: Served, endpoint: str, refused: dict, neutral: dict
) -> None:
    (name,) = refused
    if endpoint == "completions":
        path, body = "/v1/completions", {"prompt": "ROMEO:", "max_tokens": 2}
    else:
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}
        body["max_completion_tokens"] = 2
    message = refusal(server.post(path, {**body, **refused}), name)
    assert message == f"{name}: {REFUSED[name]}"
    assert server.post(path, {**body, **neutral}).status_code == 200


def test_bookkeeping_fields_are_accepted_and_change_nothing(server: Served) -> None:
    plain = complete(server)["choices"][0]["text"]
    bookkeeping = {
        "user": "u-1",
        "store": False,
        "metadata": {"team": "a"},
        "service_tier": "auto",
        "priority": -5,
    }
    assert complete(server, **bookkeeping)["choices"][0]["text"] == plain
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 6}
    chat |= {"temperature": 0}
    reply = server.post("/v1/chat/completions", chat).json()["choices"][0]["message"]
    extra = {**bookkeeping, "reasoning_effort": "low", "prediction": {"type": "content"}}
    again = server.post("/v1/chat/completions", {**chat, **extra})
    assert again.json()["choices"][0]["message"] == reply


def test_include_stop_str_in_output_keeps_the_matched_stop_string(server: Served) -> None:
    text = complete(server, max_tokens=24, ignore_eos=True)["choices"][0]["text"]
    stop = text[5:8]
    at = text.index(stop)
    for fetch in (lambda s, **f: complete(s, **f)["choices"][0]["text"], stream_text):
        assert fetch(server, max_tokens=24, ignore_eos=True, stop=stop) == text[:at]
        kept = fetch(
            server, max_tokens=24, ignore_eos=True, stop=stop, include_stop_str_in_output=True
        )
        assert kept == text[: at + len(stop)]


def test_no_stop_string_counts_before_min_tokens(server: Served) -> None:
    text = complete(server, max_tokens=24, ignore_eos=True)["choices"][0]["text"]
    early = complete(server, max_tokens=6, ignore_eos=True)["choices"][0]["text"]
    stop = text[1:3]  # first seen in the first tokens' text
    later = text.find(stop, len(early))
    assert text.index(stop) < len(early) and later > 0, "pick another stop string"
    # The first 6 tokens' text is never searched: the stop string counts from token 7 on.
    fields = {"max_tokens": 24, "ignore_eos": True, "stop": stop, "min_tokens": 7}
    assert complete(server, **fields)["choices"][0]["text"] == text[:later]
    assert stream_text(server, **fields) == text[:later]


def test_min_tokens_holds_off_the_end_of_sequence_token(server: Served) -> None:
    """With EOS biased to certainty, the choice ends on the first token min_tokens allows."""
    bias = {"logit_bias": {str(EOS): 100}}
    assert complete(server, **bias)["usage"]["completion_tokens"] == 1
    answer = complete(server, **bias, min_tokens=5)
    assert answer["usage"]["completion_tokens"] == 6
    assert answer["choices"][0]["finish_reason"] == "stop"


def test_logit_bias_and_skip_special_tokens(server: Served, tokenizer: Any) -> None:
    """EOS biased to certainty past ignore_eos: its text shows only without skipping."""
    fields = {"max_tokens": 3, "ignore_eos": True, "logit_bias": {str(EOS): 100}}
    assert complete(server, **fields)["choices"][0]["text"] == ""
    kept = complete(server, **fields, skip_special_tokens=False)["choices"][0]["text"]
    assert kept == tokenizer.eos_token * 3
    (token,) = tokenizer.encode(" the", add_special_tokens=False)
    biased = complete(server, max_tokens=4, logit_bias={str(token): 100})
    assert biased["choices"][0]["text"] == " the" * 4


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"logit_bias": {"the": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"99999": 1}}, "logit_bias"),  # outside the vocabulary
        ({"min_tokens": 13}, "min_tokens"),  # more than max_tokens
        ({"min_p": 1.5}, "min_p"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ],
)
def test_extension_values_out_of_range_are_400(server: Served, fields: dict, param: str) -> None:
    body = {"prompt": "ROMEO:", "max_tokens": 12, **fields}
    refusal(server.post("/v1/completions", body), param)


def test_min_p_of_one_keeps_only_the_most_likely_token(server: Served) -> None:
    greedy = complete(server)["choices"][0]["text"]
    sampled = complete(server, temperature=1.0, seed=3, min_p=1.0)
    assert sampled["choices"][0]["text"] == greedy


def test_truncate_prompt_tokens_keeps_the_last_tokens(server: Served, tokenizer: Any) -> None:
    prompt = tokenizer.encode("ROMEO: what news from Verona, good friend?")
    whole = complete(server, prompt=prompt[-4:])
    cut = complete(server, prompt=prompt, truncate_prompt_tokens=4)
    assert cut["choices"][0]["text"] == whole["choices"][0]["text"]
    assert cut["usage"]["prompt_tokens"] == 4
    echoed = complete(server, prompt="ROMEO: hark", truncate_prompt_tokens=2, echo=True)
    assert echoed["choices"][0]["text"].startswith(
        tokenizer.decode(tokenizer.encode("ROMEO: hark")[-2:])
    )


def test_add_special_tokens_false_leaves_out_the_bos(server: Served, tokenizer: Any) -> None:
    without = complete(server, add_special_tokens=False)
    assert without["usage"]["prompt_tokens"] == len(tokenizer.encode("ROMEO:")) - 1
    as_ids = complete(server, prompt=tokenizer.encode("ROMEO:", add_special_tokens=False))
    assert without["choices"][0]["text"] == as_ids["choices"][0]["text"]


def test_request_id_names_the_response(server: Served) -> None:
    assert complete(server, request_id="abc-1")["id"] == "cmpl-abc-1"
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 3}
    chunks = streamed(server, "/v1/chat/completions", {**chat, "request_id": "abc-2"})
    assert {chunk["id"] for chunk in chunks} == {"chatcmpl-abc-2"}


def test_continuous_usage_stats_put_each_choices_usage_in_every_chunk(
    server: Served, tokenizer: Any
) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True, "include_obfuscation": True}
    body = {"model": MODEL_NAME, "prompt": "ROMEO:", "max_tokens": 5, "n": 2, "temperature": 1}
    chunks = streamed(server, "/v1/completions", {**body, "stream_options": options})
    prompt = len(tokenizer.encode("ROMEO:"))
    seen = [0, 0]
    for chunk in chunks[:-1]:
        assert "obfuscation" not in chunk
        (choice,) = chunk["choices"]
        usage = chunk["usage"]
        assert usage["prompt_tokens"] == prompt
        assert usage["completion_tokens"] >= seen[choice["index"]]
        assert usage["total_tokens"] == prompt + usage["completion_tokens"]
        seen[choice["index"]] = usage["completion_tokens"]
    assert seen == [5, 5]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10


def test_chat_prompt_fields_reach_the_plain_template(server: Served, tokenizer: Any) -> None:
    messages = [
        {"role": "user", "content": "Speak."},
        {"role": "assistant", "content": "Good morrow"},
    ]
    chat = {"messages": messages, "max_completion_tokens": 6, "temperature": 0}
    fields = {"add_generation_prompt": False, "continue_final_message": True, "echo": True}
    answer = server.post("/v1/chat/completions", {**chat, **fields}).json()
    prompt = tokenizer.encode(plain_prompt(messages, continue_final_message=True))
    assert answer["usage"]["prompt_tokens"] == len(prompt)
    assert answer["choices"][0]["message"]["content"].startswith("Good morrow")
    both = {**chat, "continue_final_message": True}  # add_generation_prompt defaults to true
    refusal(server.post("/v1/chat/completions", both), "continue_final_message")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    forced = {**chat, "echo": True, "tools": [tool], "tool_choice": "required"}
    refusal(server.post("/v1/chat/completions", forced), "echo")
    bare = server.post("/v1/chat/completions", {**chat, "add_generation_prompt": False}).json()
    assert bare["usage"]["prompt_tokens"] == len(
        tokenizer.encode(plain_prompt(messages, add_generation_prompt=False))
    )


def test_the_plain_template_continues_or_leaves_out_the_generation_prompt() -> None:
    messages = [("user", "Speak."), ("assistant", "Good morrow")]
    assert plain_prompt(messages).endswith("Good morrow\n\nASSISTANT:\n")
    assert plain_prompt(messages, add_generation_prompt=False).endswith("Good morrow\n\n")
    assert plain_prompt(messages, continue_final_message=True).endswith("\nGood morrow")


TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}{{ greeting | default('') }}"
)


def test_a_jinja_template_takes_the_kwargs_and_continues_the_last_message(
    tokenizer: Any,
) -> None:
    chat = ChatFormatter(tokenizer, TEMPLATE)
    messages = [("user", "Speak."), ("assistant", " Good morrow ")]

    def text(**options: Any) -> str:
        return tokenizer.decode(chat.token_ids(messages, **options), skip_special_tokens=False)

    assert text(template_kwargs={"greeting": "Hail"}).endswith("<assistant>Hail")
    assert text(continue_final_message=True).endswith("<assistant> Good morrow ")
    assert text(add_generation_prompt=False).endswith("</assistant>")
    with_bos = chat.token_ids(messages, add_special_tokens=True)
    assert with_bos[0] == EOS and chat.token_ids(messages)[0] != EOS
    reserved = {
        "messages": [{"role": "user", "content": "x"}],
        "chat_template_kwargs": {"tools": 1},
    }
    with pytest.raises(ValueError, match="tools is the server's to set"):
        ChatCompletionRequest.model_validate(reserved)

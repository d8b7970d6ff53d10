"""Logprobs in OpenAI's two formats, and the penalties, through the server.

The formatting is checked on its own first (a token event with log-probabilities, as the
engine's outcome reports them); the end-to-end tests need `SamplingParams(logprobs=...,
repetition_penalty=...)` from the sampling work and are skipped until it is in the core.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, NamedTuple

import httpx
import pytest
from server_helpers import MODEL_NAME, Served, served, sse_payloads

import llmengine
from llmengine.sampling import SamplingParams
from llmengine.server.choices import ChoiceRun
from llmengine.server.engine_loop import TokenEvent
from llmengine.server.serving import chat_logprobs, completion_logprobs
from llmengine.server.text_stream import TextOptions

SAMPLING_LANDED = {"logprobs", "repetition_penalty"} <= set(SamplingParams.__dataclass_fields__)
needs_sampling = pytest.mark.skipif(
    not SAMPLING_LANDED, reason="SamplingParams has no logprobs or penalties yet"
)


class FakeLogprobs(NamedTuple):
    """What `llmengine.outcome.TokenLogprobs` carries."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class FakeLoop:
    """An engine loop that hands back prepared events and records aborts."""

    def __init__(self, events: list[TokenEvent]) -> None:
        self.events = events
        self.aborted: list[int] = []
        self.reasons: list[str] = []

    async def add(self, prompts: Any, params: Any) -> tuple[list[int], asyncio.Queue]:
        queue: asyncio.Queue = asyncio.Queue()
        for event in self.events:
            queue.put_nowait(event)
        return [0], queue

    def abort(self, request_ids: Any, reason: str = "abort") -> None:
        self.aborted.extend(request_ids)
        self.reasons.append(reason)


def run_choice(tokenizer: Any, texts: list[str], stop: tuple[str, ...] = ()) -> tuple:
    """Deltas of one choice whose tokens spell `texts`, each with made-up logprobs."""
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    assert all(len(one) == 1 for one in ids), "each text must be one token"
    ids = [one[0] for one in ids]
    events = [
        TokenEvent(0, token, FakeLogprobs(token, -0.5 * i, ((token, -0.5 * i), (7, -3.0))))
        for i, token in enumerate(ids)
    ]
    events[-1] = TokenEvent(0, ids[-1], events[-1].logprobs, "length")
    loop = FakeLoop(events)

    async def collect() -> list:
        run = await ChoiceRun.start(loop, tokenizer, [[1]], [SamplingParams()], TextOptions(stop))  # type: ignore[arg-type]
        return [delta async for delta in run.deltas()]

    return asyncio.run(collect()), loop


def test_completion_logprobs_are_parallel_lists_with_text_offsets(tokenizer: Any) -> None:
    deltas, _ = run_choice(tokenizer, ["KING", " and", " the"])
    tokens = [token for delta in deltas for token in delta.logprobs]
    formatted = completion_logprobs(tokens)
    seven = tokenizer.decode([7])
    assert formatted["tokens"] == ["KING", " and", " the"]
    assert formatted["token_logprobs"] == [0.0, -0.5, -1.0]
    assert formatted["top_logprobs"][1] == {" and": -0.5, seven: -3.0}
    assert formatted["text_offset"] == [0, 4, 8]
    assert "".join(delta.text for delta in deltas) == "KING and the"


def test_chat_logprobs_carry_bytes_and_top_entries(tokenizer: Any) -> None:
    deltas, _ = run_choice(tokenizer, ["KING", " and"])
    (first, second) = chat_logprobs([t for d in deltas for t in d.logprobs])["content"]
    assert first["token"] == "KING" and first["bytes"] == list(b"KING")
    assert second["logprob"] == -0.5
    assert second["top_logprobs"][0] == {"token": " and", "logprob": -0.5, "bytes": list(b" and")}


def test_a_stop_string_ends_the_choice_and_aborts_its_request(tokenizer: Any) -> None:
    deltas, loop = run_choice(tokenizer, ["KING", " and", " the"], stop=("G a",))
    assert "".join(delta.text for delta in deltas) == "KIN"
    assert deltas[-1].finish_reason == "stop" and loop.aborted == [0]
    assert loop.reasons == ["stop"]  # counted as a stop in the metrics, not an abort
    assert [t.token for d in deltas for t in d.logprobs] == ["KING", " and"]


# -- end to end, once the sampler reports logprobs and applies penalties ---------------------


@pytest.fixture(scope="module")
def server(model: llmengine.Llama, tokenizer: Any) -> Iterator[Served]:
    engine = llmengine.Engine(model, num_blocks=32, block_size=16, num_slots=4)
    with served(engine, tokenizer) as running:
        yield running


PROMPT = "ROMEO:"


def offline_logprobs(model: llmengine.Llama, tokenizer: Any, k: int, n: int) -> list[Any]:
    """The engine's own TokenLogprobs for the greedy completion of PROMPT."""
    engine = llmengine.Engine(model, num_blocks=32, block_size=16)
    params = SamplingParams(max_tokens=n, logprobs=k)
    request_id = engine.add_request(tokenizer.encode(PROMPT), params)
    found = []
    while engine.has_unfinished():
        found.append(engine.step().logprobs[request_id])
    return found


@needs_sampling
def test_completion_logprobs_are_the_engines(
    server: Served, model: llmengine.Llama, tokenizer: Any
) -> None:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    choice = server.post("/v1/completions", {**body, "logprobs": 3}).json()["choices"][0]
    expected = offline_logprobs(model, tokenizer, 3, 8)
    logprobs = choice["logprobs"]
    assert logprobs["token_logprobs"] == pytest.approx([e.logprob for e in expected])
    assert logprobs["tokens"] == [tokenizer.decode([e.token_id]) for e in expected]
    assert all(len(top) <= 3 for top in logprobs["top_logprobs"])
    for top, e in zip(logprobs["top_logprobs"], expected, strict=True):
        assert max(top.values()) == pytest.approx(e.top[0][1])
    text = choice["text"]
    for offset, token in zip(logprobs["text_offset"], logprobs["tokens"], strict=True):
        assert text[offset : offset + len(token)] == token
    with httpx.stream(
        "POST", f"{server.url}/v1/completions", json={**body, "logprobs": 3, "stream": True}
    ) as response:
        chunks = sse_payloads(response.iter_lines())
    streamed = [lp for c in chunks for lp in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert streamed == logprobs["token_logprobs"]


@needs_sampling
def test_chat_logprobs_in_the_chat_format(server: Served) -> None:
    client = server.openai()
    result = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Speak."}],
        max_completion_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = result.choices[0].logprobs.content
    assert len(content) == result.usage.completion_tokens == 6
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in content)
    assert all(entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob for entry in content)
    plain = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Speak."}], max_tokens=2
    )
    assert plain.choices[0].logprobs is None


@needs_sampling
@pytest.mark.parametrize(
    "penalty",
    [{"repetition_penalty": 1.5}, {"presence_penalty": 1.5}, {"frequency_penalty": 1.5}],
    ids=lambda p: next(iter(p)),
)
def test_penalties_reach_the_sampler(
    server: Served, model: llmengine.Llama, tokenizer: Any, penalty: dict[str, float]
) -> None:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 30, "temperature": 0}
    penalised = server.post("/v1/completions", {**body, **penalty}).json()["choices"][0]["text"]
    plain = server.post("/v1/completions", body).json()["choices"][0]["text"]
    engine = llmengine.Engine(model, num_blocks=32, block_size=16, tokenizer=tokenizer)
    (expected,) = engine.generate_text([PROMPT], SamplingParams(max_tokens=30, **penalty))
    assert penalised == expected
    assert penalised != plain

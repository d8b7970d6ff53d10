"""The two generating endpoints: a request body in, an OpenAI response or event stream out.

`Serving` holds what both need (the engine loop, the tokenizer, the chat formatter, the
model's limits) and turns a validated body into engine prompts and sampling parameters,
refusing with a 400 what the engine could never run: a prompt plus max_tokens beyond the
model's `max_position_embeddings`, or beyond the whole KV pool (the engine's own check).
Choice indices follow OpenAI: prompt i's sample j is choice i * n + j.

Default max_tokens: 16 for completions (OpenAI's legacy default); for chat, as many as fit,
which is the smaller of `max_position_embeddings` and the pool's capacity (num_blocks *
block_size tokens), minus the prompt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from llmengine.params import SamplingParams
from llmengine.server.chat import ChatFormatter
from llmengine.server.choices import ChoiceRun, Delta, TokenLogprob
from llmengine.server.engine_loop import EngineLoop, EngineStopped, QueueFull, RequestFailed
from llmengine.server.errors import APIError, bad_request
from llmengine.server.prompts import chat_echo, chat_prompt, completion_prompt
from llmengine.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
)
from llmengine.server.streaming import (
    ClientGone,
    EventStreamResponse,
    cancel_on_disconnect,
    sse_event,
)
from llmengine.server.tool_calls import (
    call_reader,
    finish_reason_of,
    message_of,
    reads_model_syntax,
    stream_deltas,
)
from llmengine.structured.constraint import Constraint

RETRY_AFTER_S = 1  # what a 429 tells a client to wait: a queue moves every engine step


def server_error(error: EngineStopped | RequestFailed) -> APIError:
    """What a client hears when the server, not its request, is at fault: 503 while the
    engine is stopped or stopping (try again later, maybe elsewhere), 500 when the engine
    failed this request alone."""
    status = 503 if isinstance(error, EngineStopped) else 500
    return APIError(status, str(error), type="server_error")


def usage(prompt_tokens: int, run: ChoiceRun, n: int) -> dict[str, Any]:
    """OpenAI's usage: tokens in and out, and how many prompt tokens the prefix cache served
    (counted once per prompt, from its first sample: the others share its blocks)."""
    cached = sum(run.cached_tokens[::n])
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": run.completion_tokens,
        "total_tokens": prompt_tokens + run.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def completion_logprobs(tokens: list[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's legacy completions format: parallel lists, top-k as {token: logprob}."""
    return {
        "tokens": [t.token for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [None if t.top is None else dict(t.top) for t in tokens],
        "text_offset": [t.offset for t in tokens],
    }


def chat_logprobs(tokens: list[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's chat format: one entry per token with its UTF-8 bytes and its top-k."""

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return {
        "content": [
            {**entry(t.token, t.logprob), "top_logprobs": [entry(*alt) for alt in t.top or []]}
            for t in tokens
        ]
    }


class Serving:
    """Completions and chat completions over one engine loop."""

    def __init__(
        self,
        engine_loop: EngineLoop,
        tokenizer: Any,
        chat: ChatFormatter,
        served_model_name: str,
        tool_call_parser: str | None = None,
    ) -> None:
        self.engine_loop = engine_loop
        self.tool_call_parser = tool_call_parser  # reads "auto" outputs (tool_calls.py)
        self.tokenizer = tokenizer
        self.chat = chat
        self.served_model_name = served_model_name
        facts = engine_loop.facts
        self.max_model_len = facts.max_model_len
        self.max_fit = min(self.max_model_len, facts.num_blocks * facts.block_size)
        self.vocab_size = facts.vocab_size
        self.grammar_compiler = facts.grammar_compiler

    # -- checks ----------------------------------------------------------------------------

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.served_model_name:
            raise APIError(
                404,
                f"the model `{name}` does not exist; this server serves `{self.served_model_name}`",
                param="model",
                code="model_not_found",
            )

    def check_length(self, prompt: list[int], max_tokens: int) -> None:
        if len(prompt) + max_tokens > self.max_model_len:
            raise bad_request(
                f"the prompt ({len(prompt)} tokens) plus max_tokens ({max_tokens}) is more than "
                f"the model's {self.max_model_len} positions",
                param="max_tokens",
            )

    def check_token_fields(self, body: SamplingFields) -> None:
        """Token ids and counts the model's vocabulary can honour."""
        vocab = self.vocab_size
        for name in ("stop_token_ids", "logit_bias"):
            for token in map(int, getattr(body, name) or ()):
                if token >= vocab:
                    raise bad_request(
                        f"{name}: {token} is not one of this model's {vocab} token ids",
                        param=name,
                    )
        if body.top_k is not None and body.top_k > vocab:
            raise bad_request(
                f"top_k: {body.top_k} is more than this model's {vocab} tokens",
                param="top_k",
            )

    def check_choices(self, count: int) -> None:
        """400 for more choices than the server could ever hold at once: a retry never helps."""
        capacity = self.engine_loop.capacity
        if count > capacity:
            raise bad_request(
                f"this request asks for {count} choices (prompts x n), more than this server "
                f"ever holds at once ({capacity}: --max-num-seqs plus --max-waiting)",
                param="n",
            )

    async def constraint_of(self, body: SamplingFields) -> Constraint | None:
        """The request's constraint, compiled (off the event loop: a large schema takes
        milliseconds) so that the engine thread finds it cached; 400 naming the problem when
        it does not compile or breaks a limit, or when it comes with `stop` or
        `stop_token_ids`, which would cut it short of its grammar."""
        try:
            constraint = body.constraint()
            if constraint is not None:
                if self.grammar_compiler is None:
                    raise ValueError("this server has no tokenizer to compile a grammar against")
                await asyncio.to_thread(self.grammar_compiler.compile, constraint)
        except ValueError as error:
            field = body.constraint_field
            raise bad_request(f"{field}: {error}", param=field) from None
        if constraint is not None and (body.stop_strings or body.stop_token_ids):
            field = "stop" if body.stop_strings else "stop_token_ids"
            raise bad_request(
                f"{field}: a stop would end a constrained output wherever it appears, before "
                f"its grammar is complete; a constrained output ends where its grammar does",
                param=field,
            )
        return constraint

    def sampling(
        self,
        body: SamplingFields,
        prompts: list[list[int]],
        max_tokens: list[int],
        k: int | None,
        prompt_k: int | None = None,
        constraint: Constraint | None = None,
    ) -> tuple[list[list[int]], list[SamplingParams]]:
        """One engine prompt and one SamplingParams per choice, in choice order."""
        self.check_token_fields(body)
        self.check_choices(len(prompts) * body.n)
        engine_prompts, params = [], []
        try:
            for prompt, budget in zip(prompts, max_tokens, strict=True):
                self.check_length(prompt, budget)
                if body.min_tokens > budget:
                    raise bad_request(
                        f"min_tokens ({body.min_tokens}) is more than max_tokens ({budget})",
                        param="min_tokens",
                    )
                for sample in range(body.n):
                    engine_prompts.append(prompt)
                    params.append(body.sampling_params(budget, sample, k, prompt_k, constraint))
        except ValueError as error:
            raise bad_request(str(error)) from None
        return engine_prompts, params

    async def start(
        self,
        body: SamplingFields,
        prompts: list[list[int]],
        params: list[SamplingParams],
        echo: list[str] | None = None,
        only_prompt: bool = False,
        keep_special_tokens: bool = False,
    ) -> ChoiceRun:
        """Add the choices to the engine; the engine's refusals become HTTP errors.
        `keep_special_tokens` decodes them with special tokens whatever the request says."""
        text = body.text_options
        if keep_special_tokens:
            text = dataclasses.replace(text, skip_special_tokens=False)
        try:
            return await ChoiceRun.start(
                self.engine_loop, self.tokenizer, prompts, params, text, echo, only_prompt
            )
        except QueueFull as error:
            raise APIError(
                429, str(error), type="rate_limit_error", code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from None  # fmt: skip
        except (EngineStopped, RequestFailed) as error:
            raise server_error(error) from None
        except ValueError as error:
            raise bad_request(str(error), param="prompt") from None

    # -- the endpoints ---------------------------------------------------------------------

    async def completions(self, body: CompletionRequest, receive: Receive) -> Response:
        self.check_model(body.model)
        # Tokenising up to MAX_CHOICES texts is CPU work: off the event loop, so that
        # /health and the other clients' streams do not wait for it.
        texts = body.prompts()
        special, keep = body.add_special_tokens, body.truncate_prompt_tokens
        prompts = await asyncio.to_thread(
            lambda: [completion_prompt(self.tokenizer, p, special, keep) for p in texts]
        )
        # max_tokens 0 (with echo) still runs the prefill, which samples one token: dropped.
        budget = max(body.budget, 1)
        constraint = await self.constraint_of(body)
        engine_prompts, params = self.sampling(
            body, prompts, [budget] * len(prompts), body.logprobs, body.prompt_scores, constraint
        )
        echo = None
        if body.echo:  # a truncated prompt echoes what is left of it
            shown = texts if keep is None else prompts
            echoed = await asyncio.to_thread(lambda: [self._decode(p) for p in shown])
            echo = [text for text in echoed for _ in range(body.n)]
        run = await self.start(body, engine_prompts, params, echo, body.budget == 0)
        shaper = _Shaper("cmpl", "text_completion", self.served_model_name, body.request_id)

        def choice(delta: Delta, text: str, logprobs: list[TokenLogprob] | None) -> dict:
            shaped = {
                "index": delta.index,
                "text": text,
                "logprobs": None if logprobs is None else completion_logprobs(logprobs),
                "finish_reason": delta.finish_reason,
            }
            if body.prompt_logprobs is not None and delta.finish_reason is not None:
                shaped["prompt_logprobs"] = self._vllm_prompt_logprobs(
                    engine_prompts[delta.index], run.prompt_logprobs(delta.index)
                )
            return shaped

        prompt_tokens = sum(len(prompt) for prompt in prompts)
        with_logprobs = body.logprobs is not None
        if body.stream:
            chunks = _stream(run, shaper, body, prompt_tokens, choice, with_logprobs)
            return EventStreamResponse(chunks, run.close)
        return await _collect(run, shaper, receive, prompt_tokens, choice, with_logprobs, body.n)

    async def chat_completions(self, body: ChatCompletionRequest, receive: Receive) -> Response:
        self.check_model(body.model)
        try:
            prompt = await asyncio.to_thread(chat_prompt, self.chat, body)
        except ValueError as error:
            raise bad_request(f"the chat template refused the messages: {error}") from None
        max_tokens = body.requested_max_tokens or self.max_fit - len(prompt)
        if max_tokens < 1:
            raise bad_request(
                f"the conversation ({len(prompt)} tokens) leaves no room to generate",
                param="messages",
            )
        constraint = await self.constraint_of(body)
        engine_prompts, params = self.sampling(
            body, [prompt], [max_tokens], body.num_logprobs, constraint=constraint
        )
        echo = chat_echo(body)
        # A call the model writes in its own syntax may be tagged with special tokens.
        tagged = reads_model_syntax(body.tools, body.tool_choice, self.tool_call_parser)
        echoes = None if echo is None else [echo]
        run = await self.start(body, engine_prompts, params, echoes, keep_special_tokens=tagged)
        kind = "chat.completion.chunk" if body.stream else "chat.completion"
        shaper = _Shaper("chatcmpl", kind, self.served_model_name, body.request_id)
        reader = call_reader(body.tools, body.tool_choice, self.tool_call_parser)
        readers = [reader() for _ in range(run.num_choices)] if reader is not None else None
        # Logprobs of text a call reader holds back wait for the chunk that sends it.
        held_logprobs: list[list[TokenLogprob]] = [[] for _ in range(run.num_choices)]

        def choice(delta: Delta, text: str, logprobs: list[TokenLogprob] | None) -> Shaped:
            reason = delta.finish_reason
            if body.stream and readers is not None:
                return streamed_calls(delta, text, logprobs)
            message = {"role": "assistant", "content": text}
            if readers is not None and reason is not None:
                message, reason = message_of(text, reason, readers[delta.index])
            logprobs_field = None if not body.logprobs else chat_logprobs(logprobs or [])
            if body.stream:
                return {
                    "index": delta.index,
                    "delta": {"content": text} if text else {},
                    "logprobs": logprobs_field,
                    "finish_reason": reason,
                }
            return {
                "index": delta.index,
                "message": message,
                "logprobs": logprobs_field,
                "finish_reason": reason,
            }

        def streamed_calls(
            delta: Delta, text: str, logprobs: list[TokenLogprob] | None
        ) -> list[dict]:
            """A chunk per delta the choice's call reader makes; the end in the last one."""
            assert readers is not None
            reader, held = readers[delta.index], held_logprobs[delta.index]
            held.extend(logprobs or [])
            reason = delta.finish_reason
            deltas = stream_deltas(reader, text, last=reason is not None)
            if reason is None and not deltas:
                return []
            chunks = [
                {"index": delta.index, "delta": part, "logprobs": None, "finish_reason": None}
                for part in deltas or [{}]
            ]
            if body.logprobs:
                chunks[0]["logprobs"] = chat_logprobs(held)
            held.clear()
            if reason is not None:
                chunks[-1]["finish_reason"] = finish_reason_of(reader, reason)
            return chunks

        if body.stream:
            chunks = _stream(run, shaper, body, len(prompt), choice, body.logprobs, chat=True)
            return EventStreamResponse(chunks, run.close)
        return await _collect(run, shaper, receive, len(prompt), choice, body.logprobs, body.n)

    def _decode(self, prompt: str | list[int]) -> str:
        """A prompt as its echo shows it: the text given, or what the token ids decode to
        (special tokens left out, as in generated text and in the logprobs' offsets)."""
        if isinstance(prompt, str):
            return prompt
        return self.tokenizer.decode(prompt, skip_special_tokens=True)

    def _vllm_prompt_logprobs(self, prompt: list[int], scores: list[Any]) -> list[Any]:
        """vLLM's `prompt_logprobs`: None for the first token, then per token a map from
        token id (a string) to its logprob and text, the prompt's token and its top k."""

        def entry(token: int, logprob: float) -> dict[str, Any]:
            text = self.tokenizer.decode([token], skip_special_tokens=False)
            return {"logprob": logprob, "decoded_token": text}

        shaped: list[Any] = [None]
        for token, score in zip(prompt[1:], scores, strict=True):
            alternatives = {str(t): entry(t, float(lp)) for t, lp in score.top}
            shaped.append({str(token): entry(token, float(score.logprob)), **alternatives})
        return shaped


# A choice's shape in the response. A stream's delta may make several chunks (a tool call's
# name, then its arguments) or none (text a tool-call reader holds back).
Shaped = dict | list[dict]
ChoiceShape = Callable[[Delta, str, "list[TokenLogprob] | None"], Shaped]


class _Shaper:
    """The envelope every response and chunk of one request shares."""

    def __init__(
        self, prefix: str, object_name: str, model: str, request_id: str | None = None
    ) -> None:
        self.id = f"{prefix}-{request_id or uuid.uuid4().hex}"  # vLLM's: the caller's id
        self.object = object_name
        self.created = int(time.time())
        self.model = model

    def wrap(self, choices: list[dict], **extra: Any) -> dict[str, Any]:
        body = {"id": self.id, "object": self.object, "created": self.created}
        return {**body, "model": self.model, "choices": choices, **extra}


async def _collect(
    run: ChoiceRun,
    shaper: _Shaper,
    receive: Receive,
    prompt_tokens: int,
    choice: ChoiceShape,
    with_logprobs: bool,
    n: int,
) -> Response:
    """The whole response at once; a client gone meanwhile gets its requests aborted."""
    texts = [""] * run.num_choices
    logprobs: list[list[TokenLogprob]] = [[] for _ in range(run.num_choices)]
    ends: list[Delta] = []

    async def gather() -> None:
        async for delta in run.deltas():
            texts[delta.index] += delta.text
            logprobs[delta.index].extend(delta.logprobs)
            if delta.finish_reason is not None:
                ends.append(delta)

    try:
        await cancel_on_disconnect(receive, gather())
    except ClientGone:
        return Response(status_code=499)  # nobody reads it
    except (EngineStopped, RequestFailed) as error:
        raise server_error(error) from None
    finally:
        run.close()
    ends.sort(key=lambda delta: delta.index)
    choices = [
        choice(end, texts[end.index], logprobs[end.index] if with_logprobs else None)
        for end in ends
    ]
    body = shaper.wrap(choices, usage=usage(prompt_tokens, run, n))
    return JSONResponse(body)


async def _stream(
    run: ChoiceRun,
    shaper: _Shaper,
    body: SamplingFields,
    prompt_tokens: int,
    choice: ChoiceShape,
    with_logprobs: bool,
    *,
    chat: bool = False,
) -> AsyncIterator[bytes]:
    """The response as SSE chunks; with include_usage, a last chunk with only the usage, and
    with continuous_usage_stats, every chunk carries its choice's usage so far (vLLM's)."""

    def extra(index: int) -> dict[str, Any]:
        if not body.continuous_usage:
            return {"usage": None} if body.include_usage else {}
        prompt, completion = run.usage_of(index)
        counts = {"prompt_tokens": prompt, "completion_tokens": completion}
        return {"usage": {**counts, "total_tokens": prompt + completion}}

    if chat:  # the first chunk of every chat choice names the role
        for i in range(run.num_choices):
            role = {"role": "assistant", "content": ""}
            first = {"index": i, "delta": role, "logprobs": None, "finish_reason": None}
            yield sse_event(shaper.wrap([first], **extra(i)))
    try:
        async for delta in run.deltas():
            shaped = choice(delta, delta.text, delta.logprobs if with_logprobs else None)
            for chunk in shaped if isinstance(shaped, list) else [shaped]:
                yield sse_event(shaper.wrap([chunk], **extra(delta.index)))
    except (EngineStopped, RequestFailed) as error:
        yield sse_event(server_error(error).body())
        return
    if body.include_usage:
        yield sse_event(shaper.wrap([], usage=usage(prompt_tokens, run, body.n)))

"""Lesson 03's exercises: what the plain loop computes, and which stop rule wins a tie.

The checkers run the loop the lesson runs (`generate_tokens` on the embedded model, watched
by a `ForwardLog`; `finish_reason` on its last token) and compare the learner's answer with
what that run shows.
"""

from __future__ import annotations

from llmengine.generation import generate_tokens
from llmengine.lessons.exercises import Verdict, check_value, embedded_model
from llmengine.lessons.forward_log import ForwardLog
from llmengine.model.tokenizer import load_tokenizer
from llmengine.params import SamplingParams, finish_reason

LINE = "ROMEO:\nBut soft, what light through yonder window breaks?"


def newline_ids() -> tuple[int, ...]:
    """Every token whose text contains a newline: the lesson's stop tokens."""
    tokenizer = load_tokenizer()
    vocab_size = embedded_model("eager").config.vocab_size
    return tuple(i for i in range(vocab_size) if "\n" in tokenizer.decode([i]))


def plain_loop_positions(prompt_tokens: int, generated: int) -> int:
    """Positions the plain loop computes for the first `prompt_tokens` tokens of the lesson's
    line and `generated` tokens, counted by a `ForwardLog`."""
    model = embedded_model("eager")
    prompt = load_tokenizer().encode(LINE)[:prompt_tokens]
    params = SamplingParams(max_tokens=generated, ignore_eos=True)
    with ForwardLog(model) as log:
        generate_tokens(model, prompt, params)
    return sum(log.positions)


def romeo_finish_reason(max_tokens: int) -> str | None:
    """Why greedy "ROMEO:\\n" with newline stop tokens and `max_tokens` ends."""
    model = embedded_model("eager")
    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=newline_ids())
    tokens = generate_tokens(model, load_tokenizer().encode("ROMEO:\n"), params)
    return finish_reason(params, len(tokens), tokens[-1], model.config.eos_token_ids)


def check_plain_loop_positions(answer: int | None) -> Verdict:
    """Exercise 1: positions the plain loop computes for a 10-token prompt and 20 tokens."""
    return check_value(
        answer,
        plain_loop_positions(10, 20),
        what="the positions computed for a 10-token prompt and 20 tokens",
        explain="N·P + N(N−1)/2 with P = 10 and N = 20: 200 + 190.",
    )


def check_finish_reason_at_twelve(answer: str | None) -> Verdict:
    """Exercise 2: the finish reason of greedy "ROMEO:\\n" with newline stops and 12 tokens."""
    return check_value(
        answer,
        romeo_finish_reason(12),
        what="the finish reason with max_tokens=12",
        explain=(
            "The 12th token is the newline, so two rules apply at once; length is checked "
            "first, and the first rule that applies is the reason."
        ),
    )

"""Two deliberately wrong ways to bring a preempted request back, for lesson 15 to watch fail.

The engine resumes a preempted request over its prompt plus every token it generated, so the
token it samples next is the one it would have sampled had it never been evicted. Two versions
are easy to write instead, and both still run to completion, drain the pool and return a full
budget of tokens per request:

- restart: throw the generated tokens away with the K/V and prefill the prompt again;
- prompt only: keep the generated tokens but prefill only the prompt, so the next token is
  sampled from the end of the prompt and repeats the request's first generated token.

They are here, as `Scheduler.prefill_row` overrides run on the real model through
`Engine.scheduler_class`, so that a lesson can show the cramped-against-roomy comparison
catching them. Nothing in the serving core can select them.
"""

from __future__ import annotations

from llmengine.engine import Engine
from llmengine.scheduling.decision import ScheduledRow
from llmengine.scheduling.request import Request
from llmengine.scheduling.scheduler import Scheduler


class RestartScheduler(Scheduler):
    """WRONG ON PURPOSE: a resumed request starts again from its prompt.

    Its generated tokens are dropped from `token_ids` (and so from `output_token_ids`, which
    is derived from it), its budget counts from zero again, and its sampler carries on from
    where it was. A greedy request therefore rebuilds the same text at the price of the
    positions it throws away; a sampled one draws new tokens and returns other text. The
    blocks it was given at admission were bought for the longer sequence before this rule
    runs; it keeps them and grows into them, so the pool's books stay balanced.
    """

    def prefill_row(self, request: Request, max_positions: int | None = None) -> ScheduledRow:
        if request.num_preemptions > 0:
            del request.token_ids[len(request.prompt_token_ids) :]
        return super().prefill_row(request, max_positions)


class PromptOnlyScheduler(Scheduler):
    """WRONG ON PURPOSE: a resumed request keeps its tokens but prefills its prompt alone.

    The row computes the prompt's positions only, so the token sampled from it is the one
    that follows the prompt: the request's first generated token, appended again after the
    last one. Later decodes attend over positions whose K/V was never rebuilt and whatever
    the blocks' previous holder left there. The block table records the positions the rows
    computed, which stay within the blocks the request holds, so the engine runs to the end.
    The row samples though it stops short of the request's end, and ignores any budget.
    """

    def prefill_row(self, request: Request, max_positions: int | None = None) -> ScheduledRow:
        if request.num_preemptions == 0:
            return super().prefill_row(request, max_positions)
        prompt_length = len(request.prompt_token_ids)
        return ScheduledRow(
            request,
            start_position=0,
            num_positions=prompt_length,
            is_prefill=True,
            recomputed=prompt_length,
        )


class RestartEngine(Engine):
    """The engine with `RestartScheduler`: resumes by restarting. Deliberately wrong."""

    scheduler_class = RestartScheduler


class PromptOnlyEngine(Engine):
    """The engine with `PromptOnlyScheduler`: resumes over the prompt only. Deliberately wrong."""

    scheduler_class = PromptOnlyScheduler

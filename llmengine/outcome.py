"""What one engine step reports: the only thing batchbench reads.

A plain record, so that a benchmark, a lesson or a test can replay a run from its outcomes
without touching the engine's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmengine.kv.blocks import blocks_for_length

if TYPE_CHECKING:
    from llmengine.engine_config import EngineConfig
    from llmengine.scheduling.decision import SchedulerOutput
    from llmengine.scheduling.request import Request


# How a step's forward ran (`IterationOutcome.forward`): the decode graph, or eager and why.
DECODE_GRAPH = "decode_graph"
EAGER = "eager"  # no decode graphs were asked for
EAGER_PREFILL = "eager_prefill"  # a prefill or a chunk of one among the rows
EAGER_DRAFTS = "eager_drafts"  # a decode row carries drafted tokens: several positions
EAGER_NO_BUCKET = "eager_no_bucket"  # more rows than the largest kept bucket holds


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """The log-probability of one sampled token and of the most likely tokens at its position.

    Log-probabilities are the log-softmax of the model's raw logits, before penalties and
    temperature (as vLLM's V1 reports them by default): what the model thinks, not what the
    sampler drew from. `top` holds the request's `logprobs` most likely tokens, most likely
    first, ties in vocabulary order; it is empty when the request asked for 0.
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class PoolShape:
    """What every step of one run shares: the slots, the pool's blocks and their size, the
    bytes a block holds across every layer, and the host swap space's blocks. Made once per
    run and referenced by each of its outcomes."""

    num_slots: int = 0
    num_blocks: int = 0
    block_size: int = 0
    bytes_per_block: int = 0
    num_swap_blocks: int = 0

    @classmethod
    def of(cls, config: EngineConfig, bytes_per_block: int) -> PoolShape:
        return cls(
            config.num_slots, config.num_blocks, config.block_size, bytes_per_block,
            config.swap_blocks,
        )  # fmt: skip


@dataclass(slots=True)
class IterationOutcome:
    """One scheduling decision and the one forward that followed it.

    `forward_tokens` counts the positions the forward computed (pad excluded): a decode row is
    one position, a prefill row its whole length, or under `max_num_batched_tokens` its
    chunk's. `recomputed_tokens` is the part of that which was K/V the engine had held before
    and threw away on preemption: every position of a resumed prefill, or, for a request
    evicted part way through its prefill, the positions it had computed (`ScheduledRow`).
    `padded_tokens` counts the positions a rectangular batch computes only to keep its shape
    (pad after a short prompt, rows of requests already done): 0 for the engine, which never
    pads, and the static batch's bill.

    `row_positions` itemises `forward_tokens` by row (request id to the positions its row
    computed: 1 for a decode, the whole sequence or a chunk of it for a prefill) and
    `resumed` names the admissions that were resumptions after a preemption: a counter of
    rows sees each as one row, these two see what each one cost.

    Chunked prefill: `tokens` (and `logprobs`) hold only rows that reached their request's
    last token, so a prefill chunk that stops short is in `row_positions` and `prefill_rows`
    but samples nothing. `admitted` (and `resumed`) name a request once per admission, in the
    step of its first chunk; `prefill_rows` counts every chunk.

    `pool` is the run's `PoolShape` (one object for every step; `num_slots`, `num_blocks`,
    `block_size`, `bytes_per_block` and `num_swap_blocks` read it). The pool fields describe
    the cache the forward ran on, as the forward left it (requests it
    finished included, though their blocks are free again by the time the step returns):
    `held_blocks` of `num_blocks` are booked by some request, `needed_blocks` are what the K/V
    actually written (`kv_tokens` positions) fills, so held - needed is reservation waste and
    needed * block_size - kv_tokens is the unfilled tail of last blocks (fragmentation).

    Preemption: `evicted` names every victim of the step, `evicted_for` maps each victim to
    the request whose growth took its blocks (itself when it gave way), `swapped_out` those
    of them whose K/V went to the host swap space (the others were preempted by recompute and
    will come back as `resumed` prefills), `swapped_in` the swapped requests that came back,
    each as a decode row of one position with nothing recomputed. `blocks_swapped_out` and
    `blocks_swapped_in` count the blocks copied each way before the forward, each
    `bytes_per_block` bytes; `held_swap_blocks` of `num_swap_blocks` host blocks were booked
    once the step was decided.

    `logprobs` has a `TokenLogprobs` for the token of every row whose request asked for them.
    `prompt_logprobs` has, for each request with `prompt_logprobs` whose prefill computed
    prompt positions, the logprobs of the prompt tokens they score, in prompt order (token 1
    on; a chunked prefill reports its prompt chunk by chunk).
    `cached_prefix` gives, for each request admitted with prefix-cache hits, how many of its
    leading tokens the cache served (what `cached_tokens` sums).
    `failed` names the requests this step could not serve, with why (their inputs could not
    be prepared, so the forward left their rows out; logits that were not finite; their
    sampling, grammar or drafts' check raised): each got no token and is aborted, while the
    other rows went on as usual.

    Speculative decoding: a row with drafts may add several tokens in one step, and its entry
    in `tokens` is then a list (`new_tokens` reads either form); `drafts` gives, for each such
    row, the tokens proposed and how many of them the model kept.

    `forward` says how the step's forward ran: "decode_graph", or eager and why: "eager" (no
    graphs asked for), "eager_prefill", "eager_drafts" or "eager_no_bucket" (more rows than
    the largest kept bucket). `forward_seconds` is the wall time from the forward's launch to
    its sampled tokens read back (on a GPU the read-back waits for the device, so this is the
    device's share of the step; the rest of the step is the host's). Being a clock's reading,
    it takes no part in comparing two outcomes.
    """

    iteration: int
    tokens: dict[int, int | list[int]] = field(default_factory=dict)
    drafts: dict[int, tuple[int, int]] = field(default_factory=dict)
    logprobs: dict[int, TokenLogprobs] = field(default_factory=dict)
    finished: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    prompt_logprobs: dict[int, list[TokenLogprobs]] = field(default_factory=dict)
    cached_prefix: dict[int, int] = field(default_factory=dict)
    evicted: list[int] = field(default_factory=list)
    evicted_for: dict[int, int] = field(default_factory=dict)
    swapped_out: list[int] = field(default_factory=list)
    swapped_in: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)
    resumed: list[int] = field(default_factory=list)
    row_positions: dict[int, int] = field(default_factory=dict)
    rows: int = 0
    prefill_rows: int = 0
    forward_tokens: int = 0
    recomputed_tokens: int = 0
    cached_tokens: int = 0
    padded_tokens: int = 0
    pool: PoolShape = field(default_factory=PoolShape)
    held_blocks: int = 0
    needed_blocks: int = 0
    kv_tokens: int = 0
    blocks_swapped_out: int = 0
    blocks_swapped_in: int = 0
    held_swap_blocks: int = 0
    forward: str = EAGER
    forward_seconds: float = field(default=0.0, compare=False)  # a clock, not what ran

    @property
    def num_slots(self) -> int:
        return self.pool.num_slots

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    @property
    def bytes_per_block(self) -> int:
        return self.pool.bytes_per_block

    @property
    def num_swap_blocks(self) -> int:
        return self.pool.num_swap_blocks

    def new_tokens(self, request_id: int) -> list[int]:
        """The tokens this step added to a request, in order (none if it added none)."""
        added = self.tokens.get(request_id)
        return [] if added is None else [added] if isinstance(added, int) else list(added)

    @property
    def num_new_tokens(self) -> int:
        """Tokens this step added, over every request."""
        return sum(len(self.new_tokens(request_id)) for request_id in self.tokens)

    @property
    def num_draft_tokens(self) -> int:
        """Drafted tokens this step's forward checked."""
        return sum(proposed for proposed, _ in self.drafts.values())

    @property
    def num_accepted_tokens(self) -> int:
        """Drafted tokens the model kept."""
        return sum(accepted for _, accepted in self.drafts.values())


@dataclass(slots=True)
class StepResult:
    """What the model runner made of one step (`ModelRunner.run`): a token per sampling row
    whose logits were finite (a list for a row with drafts: those kept, then the model's own),
    the logprobs of those that asked, the prompt logprobs the prefill rows scored, the
    requests that failed, with why, each drafting row's proposed and kept counts, and how the
    forward ran (`forward`, as `IterationOutcome.forward`) and how long it took with its
    sampling (`forward_seconds`). `left_out` names the failed requests whose rows the forward
    did not compute (their inputs could not be prepared): the scheduler takes their rows back
    (`Scheduler.forward_failed`)."""

    tokens: dict[int, int | list[int]] = field(default_factory=dict)
    logprobs: dict[int, TokenLogprobs] = field(default_factory=dict)
    prompt_logprobs: dict[int, list[TokenLogprobs]] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    drafts: dict[int, tuple[int, int]] = field(default_factory=dict)
    forward: str = EAGER
    forward_seconds: float = field(default=0.0, compare=False)  # a clock, not what ran
    left_out: list[int] = field(default_factory=list)


def build_outcome(
    iteration: int,
    decision: SchedulerOutput,
    finished: list[Request],
    result: StepResult,
    pool: PoolShape,
) -> IterationOutcome:
    """The step as the world sees it: the decision it carried out, what the model runner made
    of it, and the requests that finished.

    The pool numbers describe the forward: the blocks held while it ran and the K/V it left,
    finished requests included, whose blocks `update` has already given back.
    """
    rows = decision.rows
    admitted = [request.request_id for request in decision.admitted]
    return IterationOutcome(
        iteration=iteration,
        tokens=result.tokens,
        drafts=result.drafts,
        logprobs=result.logprobs,
        prompt_logprobs=result.prompt_logprobs,
        failed=result.failed,
        finished=[request.request_id for request in finished],
        evicted=[request.request_id for request in decision.preempted],
        evicted_for=dict(decision.preempted_for),
        swapped_out=[request.request_id for request in decision.swapped_out],
        swapped_in=[request.request_id for request in decision.swapped_in],
        admitted=admitted,
        # Preempted by recompute before, not "recomputes something": a resumed prefill may
        # find all it had computed in the prefix cache.
        resumed=[
            row.request.request_id
            for row in rows
            if row.request.num_discarded_tokens and row.request.request_id in admitted
        ],
        row_positions={row.request.request_id: row.num_positions for row in rows},
        rows=len(rows),
        prefill_rows=sum(row.is_prefill for row in rows),
        forward_tokens=sum(row.num_positions for row in rows),
        recomputed_tokens=sum(row.recomputed for row in rows),
        cached_tokens=sum(row.cached for row in rows),
        cached_prefix={row.request.request_id: row.cached for row in rows if row.cached},
        pool=pool,
        held_blocks=decision.held_blocks,
        needed_blocks=sum(blocks_for_length(row.end_position, pool.block_size) for row in rows),
        kv_tokens=sum(row.end_position for row in rows),
        blocks_swapped_out=len(decision.blocks_to_swap_out),
        blocks_swapped_in=len(decision.blocks_to_swap_in),
        held_swap_blocks=decision.held_swap_blocks,
        forward=result.forward,
        forward_seconds=result.forward_seconds,
    )

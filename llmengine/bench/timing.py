"""What a run of the engine cost, computed from its `IterationOutcome` stream and nothing else.

`ContinuousTiming.from_outcomes` reads the outcomes in order, with the clock time at the end
of each step and when each request arrived. It never looks at the engine, so the same
arithmetic serves a real engine run, a scripted list of outcomes in a test, and the records
a static-batching lesson writes for itself.

Two units of time run side by side. Iterations count forwards, one per outcome, and give the
deterministic tables. Clock time (the `_s` fields) is seconds on a wall clock and one unit
per forward on the iteration clock, where the two agree.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import fmean

from llmengine.outcome import IterationOutcome


@dataclass(frozen=True, slots=True)
class Arrival:
    """When a request arrived: forwards already run, and the clock time."""

    iteration: int = 0
    time: float = 0.0


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between the two nearest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be in [0, 100], got {q}")
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _share(part: float, whole: float) -> float:
    """part / whole, where nothing of the whole means nothing of the part either."""
    return part / whole if whole else 0.0


@dataclass(slots=True)
class ContinuousTiming:
    """Occupancy, latency and the preemption bill of one run.

    Per-iteration series are indexed by forward (rows, prefill_rows, forward_tokens, ...);
    per-request dicts are keyed by request id and hold finished requests only. Iterations in
    `preempted_at` and latencies are 1-based forward numbers: a request evicted in the
    scheduling decision of the 3rd forward was evicted "in iteration 3", and a request that
    arrived before the first forward and got its last token from the 24th has latency 24.

    `preemption_latency_penalty` compares victims with requests that ran straight through, and
    its control group is contaminated: the victim is always the youngest running request,
    which under a burst is also the one that would have finished last anyway, so the ratio
    overstates what being preempted cost by whatever late admission already cost. The clean
    comparison is the same request across two pools (`sweep_pool_sizes` keeps per-request
    results for exactly that).

    Under preemption by swap, `preempted_at` still records every eviction; `swapped_out_at`
    and `swapped_in_at` record the ones that went to host memory and their returns, and
    `blocks_swapped_out` / `blocks_swapped_in` the blocks copied per forward, each of
    `bytes_per_block` bytes.
    """

    num_slots: int
    block_size: int
    rows: list[int]
    prefill_rows: list[int]
    forward_tokens: list[int]
    recomputed_tokens: list[int]
    tokens_collected: list[int]
    held_blocks: list[int]
    needed_blocks: list[int]
    kv_tokens: list[int]
    end_times_s: list[float]
    arrivals: dict[int, Arrival]
    preempted_at: dict[int, list[int]] = field(default_factory=dict)
    latencies_iterations: dict[int, int] = field(default_factory=dict)
    latencies_s: dict[int, float] = field(default_factory=dict)
    time_to_first_token_s: dict[int, float] = field(default_factory=dict)
    time_per_output_token_s: dict[int, float] = field(default_factory=dict)
    padded_tokens: list[int] = field(default_factory=list)
    swapped_out_at: dict[int, list[int]] = field(default_factory=dict)
    swapped_in_at: dict[int, list[int]] = field(default_factory=dict)
    blocks_swapped_out: list[int] = field(default_factory=list)
    blocks_swapped_in: list[int] = field(default_factory=list)
    bytes_per_block: int = 0
    num_swap_blocks: int = 0

    @classmethod
    def from_outcomes(
        cls,
        outcomes: Sequence[IterationOutcome],
        *,
        times: Sequence[float] | None = None,
        arrivals: dict[int, Arrival] | None = None,
    ) -> ContinuousTiming:
        """Build the timing from a run's outcomes, one per forward, in step order.

        `times[i]` is the clock after outcome i (default: i + 1, the iteration clock).
        `arrivals` defaults to every request arriving before the first forward at time 0. A
        forward's `forward_tokens` left at 0 is charged one position per row, which is exactly
        what a decode-only iteration computes.
        """
        if not outcomes:
            raise ValueError("no forward in these outcomes: nothing to time")
        if times is None:
            times = [float(number) for number in range(1, len(outcomes) + 1)]
        if len(times) != len(outcomes):
            raise ValueError(f"{len(outcomes)} outcomes but {len(times)} times")
        if arrivals is None:
            arrivals = {request_id: Arrival() for request_id in _request_ids(outcomes)}
        timing = cls(
            num_slots=outcomes[0].num_slots,
            block_size=outcomes[0].block_size,
            rows=[o.rows for o in outcomes],
            prefill_rows=[o.prefill_rows for o in outcomes],
            forward_tokens=[o.forward_tokens or o.rows for o in outcomes],
            recomputed_tokens=[o.recomputed_tokens for o in outcomes],
            tokens_collected=[len(o.tokens) for o in outcomes],
            held_blocks=[o.held_blocks for o in outcomes],
            needed_blocks=[o.needed_blocks for o in outcomes],
            kv_tokens=[o.kv_tokens for o in outcomes],
            end_times_s=list(times),
            arrivals=dict(arrivals),
            padded_tokens=[o.padded_tokens for o in outcomes],
            blocks_swapped_out=[o.blocks_swapped_out for o in outcomes],
            blocks_swapped_in=[o.blocks_swapped_in for o in outcomes],
            bytes_per_block=outcomes[0].bytes_per_block,
            num_swap_blocks=outcomes[0].num_swap_blocks,
        )
        timing._read_requests(outcomes, times)
        return timing

    def _read_requests(self, outcomes: Sequence[IterationOutcome], times: Sequence[float]) -> None:
        first_token_s: dict[int, float] = {}
        last_token_s: dict[int, float] = {}
        num_tokens: dict[int, int] = {}
        for iteration, (outcome, now) in enumerate(zip(outcomes, times, strict=True), start=1):
            for request_id in outcome.evicted:
                self.preempted_at.setdefault(request_id, []).append(iteration)
            for request_id in outcome.swapped_out:
                self.swapped_out_at.setdefault(request_id, []).append(iteration)
            for request_id in outcome.swapped_in:
                self.swapped_in_at.setdefault(request_id, []).append(iteration)
            for request_id in outcome.tokens:
                first_token_s.setdefault(request_id, now)
                last_token_s[request_id] = now
                added = len(outcome.new_tokens(request_id))
                num_tokens[request_id] = num_tokens.get(request_id, 0) + added
            for request_id in outcome.finished:
                arrival = self.arrivals.setdefault(request_id, Arrival())
                self.latencies_iterations[request_id] = iteration - arrival.iteration
                self.latencies_s[request_id] = now - arrival.time
                self.time_to_first_token_s[request_id] = first_token_s[request_id] - arrival.time
                if num_tokens[request_id] > 1:
                    self.time_per_output_token_s[request_id] = (now - first_token_s[request_id]) / (
                        num_tokens[request_id] - 1
                    )

    # -- throughput ----------------------------------------------------------------------

    @property
    def iterations(self) -> int:
        return len(self.rows)

    @property
    def num_requests(self) -> int:
        return len(self.arrivals)

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens_collected)

    @property
    def occupancy(self) -> float:
        """Tokens collected / (iterations x slots): the share of the batch that did work."""
        return self.total_tokens / (self.iterations * self.num_slots)

    @property
    def waste_fraction(self) -> float:
        """Issued rows that produced no token (padding), over issued rows.

        0 for continuous batching, where every row is a live request; a static batch keeps
        running rows for requests that already finished, and this is that bill.
        """
        return _share(sum(self.rows) - self.total_tokens, sum(self.rows))

    @property
    def padding_fraction(self) -> float:
        """Positions computed only to keep a batch rectangular, over all positions computed.

        The same bill as `waste_fraction` counted in positions rather than rows, so it also
        sees the pad after short prompts in a padded prefill. 0 for continuous batching.
        """
        padded = sum(self.padded_tokens)
        return _share(padded, padded + self.total_forward_tokens)

    # -- the preemption bill -----------------------------------------------------------------

    @property
    def preemptions(self) -> int:
        return sum(len(iterations) for iterations in self.preempted_at.values())

    @property
    def preemptions_per_request(self) -> float:
        return _share(self.preemptions, self.num_requests)

    @property
    def total_forward_tokens(self) -> int:
        return sum(self.forward_tokens)

    @property
    def total_recomputed_tokens(self) -> int:
        return sum(self.recomputed_tokens)

    @property
    def recompute_fraction(self) -> float:
        """Positions computed again after an eviction, over all positions computed."""
        return _share(self.total_recomputed_tokens, self.total_forward_tokens)

    @property
    def tokens_per_eviction(self) -> float | None:
        """Recomputed positions per preemption by recompute: how long those victims were.

        A swapped victim recomputes nothing, so only evictions by recompute divide. None when
        nothing was preempted by recompute: there is no eviction to divide by.
        """
        if not self.recompute_preemptions:
            return None
        return self.total_recomputed_tokens / self.recompute_preemptions

    # -- the swap bill -------------------------------------------------------------------

    @property
    def swap_outs(self) -> int:
        """Evictions whose K/V went to the host swap space."""
        return sum(len(iterations) for iterations in self.swapped_out_at.values())

    @property
    def swap_ins(self) -> int:
        """Returns from the swap space, each a decode row with nothing recomputed."""
        return sum(len(iterations) for iterations in self.swapped_in_at.values())

    @property
    def recompute_preemptions(self) -> int:
        """Evictions that threw the K/V away: all of them under recompute, fallbacks under swap."""
        return self.preemptions - self.swap_outs

    @property
    def total_blocks_swapped_out(self) -> int:
        return sum(self.blocks_swapped_out)

    @property
    def total_blocks_swapped_in(self) -> int:
        return sum(self.blocks_swapped_in)

    @property
    def bytes_swapped(self) -> int:
        """Bytes copied between the device and host memory, both ways, across the run."""
        moved = self.total_blocks_swapped_out + self.total_blocks_swapped_in
        return moved * self.bytes_per_block

    @property
    def preempted_latencies_s(self) -> dict[int, float]:
        return {r: t for r, t in self.latencies_s.items() if r in self.preempted_at}

    @property
    def straight_through_latencies_s(self) -> dict[int, float]:
        return {r: t for r, t in self.latencies_s.items() if r not in self.preempted_at}

    @property
    def preemption_latency_penalty(self) -> float | None:
        """Mean victim latency over mean straight-through latency (see the class docstring).

        1.0 when nobody was preempted: nobody was punished. None when nobody ran straight
        through (or their latency measured zero): there is no control group, and comparing
        the victims with themselves would read 1.0, "preemption was free".
        """
        victims = self.preempted_latencies_s
        if not victims:
            return 1.0
        control = self.straight_through_latencies_s
        if not control or not fmean(control.values()):
            return None
        return fmean(victims.values()) / fmean(control.values())

    # -- latency -------------------------------------------------------------------------

    @property
    def mean_latency_s(self) -> float:
        """The run's mean latency, which under preemption describes nobody (Day 34)."""
        return fmean(self.latencies_s.values())

    @property
    def mean_latency_iterations(self) -> float:
        """The mean of `latencies_iterations`: whole forwards, whatever clock timed the run."""
        return fmean(self.latencies_iterations.values())

    def latency_percentiles(self, qs: Sequence[float] = (50, 90, 99)) -> dict[float, float]:
        return {q: percentile(self.latencies_s.values(), q) for q in qs}

    # -- the pool ------------------------------------------------------------------------

    @property
    def reservation_waste(self) -> float:
        """Blocks held but not needed by the K/V written, over blocks held, across the run."""
        return _share(sum(self.held_blocks) - sum(self.needed_blocks), sum(self.held_blocks))

    @property
    def fragmentation_waste(self) -> float:
        """The unfilled tails of last blocks, over the capacity of the blocks needed."""
        capacity = sum(self.needed_blocks) * self.block_size
        return _share(capacity - sum(self.kv_tokens), capacity)


def _request_ids(outcomes: Sequence[IterationOutcome]) -> list[int]:
    seen: dict[int, None] = {}
    for outcome in outcomes:
        for request_id in (*outcome.admitted, *outcome.tokens, *outcome.evicted):
            seen.setdefault(request_id)
    return list(seen)

"""The numbers the two seed posts publish, written down once.

Every test that checks a seed number reads it from here: the scheduler over integers, the
engine on the embedded model through batchbench, and the committed lesson reports. Values are
transcribed from `../shared/seeds/` (Day 33's and Day 34's "Why it matters" sections) in the
units and roundings the posts print.
"""

from __future__ import annotations

from dataclasses import dataclass

# -- Day 33: four requests, 5-token prompts, 24 tokens each, 4 slots, block size 4 --------


@dataclass(frozen=True, slots=True)
class Day33Row:
    iterations: int
    occupancy: float  # to 3 decimals
    preemptions: int
    recomputed: int


DAY33_REQUESTS, DAY33_PROMPT, DAY33_BUDGET, DAY33_SLOTS, DAY33_BLOCK = 4, 5, 24, 4, 4
DAY33_TOKENS = 96
# (pool in tokens, policy) -> the row; "either" at 128 tokens is both policies.
DAY33: dict[tuple[int, str], Day33Row] = {
    (48, "reserve"): Day33Row(96, 0.250, 0, 0),
    (48, "incremental"): Day33Row(44, 0.545, 3, 55),
    (96, "reserve"): Day33Row(48, 0.500, 0, 0),
    (96, "incremental"): Day33Row(28, 0.857, 1, 25),
    (128, "reserve"): Day33Row(24, 1.000, 0, 0),
    (128, "incremental"): Day33Row(24, 1.000, 0, 0),
}

# The Day-29 shape (8 requests, 5-token prompts, seven want 4 tokens and one 32, 8 slots,
# block size 4): the smallest pool that runs all eight at once, by policy.
DAY29_SHAPE_SMALLEST_POOL = {"reserve": 31, "incremental": 16}

# -- Day 34: six requests, 5-token prompts, 24 tokens each, 6 slots, block size 4 ---------


@dataclass(frozen=True, slots=True)
class Day34Row:
    occupancy: float  # to 3 decimals
    evictions_per_request: float  # to 2 decimals
    recompute_percent: float  # to 1 decimal
    victim_latency: float  # x, to 2 decimals


DAY34_REQUESTS, DAY34_PROMPT, DAY34_BUDGET, DAY34_SLOTS, DAY34_BLOCK = 6, 5, 24, 6, 4
DAY34_TOKENS = 144
DAY34: dict[int, Day34Row] = {
    48: Day34Row(1.000, 0.00, 0.0, 1.00),
    32: Day34Row(0.750, 0.33, 21.7, 1.25),
    24: Day34Row(0.667, 0.50, 26.3, 1.39),
    16: Day34Row(0.462, 0.83, 32.1, 1.71),
    12: Day34Row(0.375, 1.17, 39.9, 1.90),
    8: Day34Row(0.240, 1.33, 37.5, 2.83),
}
DAY34_POOLS = list(DAY34)
# At 48 and 12 blocks: 144 rows either way, 168 against 268 positions, 107 recomputed.
DAY34_FORWARD_POSITIONS = {48: 168, 12: 268}
DAY34_RECOMPUTED_AT_12 = 107
# The 12-block staircase: each request's latency in iterations, r0 .. r5, and r5's evictions.
DAY34_STAIRCASE_AT_12 = [24, 28, 36, 44, 56, 64]
DAY34_MEAN_LATENCY_AT_12 = 42
DAY34_YOUNGEST_EVICTIONS_AT_12 = 3
DAY34_YOUNGEST_LATENCY_AT_48 = 24
# Recomputed positions per eviction: tight pools catch their victims young.
DAY34_PER_EVICTION = {8: 12.0, 12: 15.3}

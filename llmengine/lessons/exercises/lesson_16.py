"""Lesson 16's exercises: the last budget that drains past the door, the pool that stops a loop,
and the step at which the oldest request finishes. Each check runs the lesson's driver,
`victim_rules.run_rule`, on the scheduler with its fake forward to find the right answer."""

from __future__ import annotations

from llmengine.kv.blocks import blocks_for_length
from llmengine.lessons.exercises import Verdict, check_value
from llmengine.lessons.victim_rules import RESTART_RULES, run_rule
from llmengine.scheduling.scheduler import Scheduler

WORKLOAD = [(4, 6), (2, 6)]  # the lesson's r0 and r1: (prompt length, budget)
SLOTS = 2


def largest_budget_that_drains(prompt: int, num_blocks: int, block_size: int) -> int:
    """The largest budget r0 (`prompt` tokens) may have, pushed past the door with the lesson's
    r1 behind it, for which the core's youngest rule still drains."""
    budget = 0
    while run_rule(
        Scheduler,
        [(prompt, budget + 1), WORKLOAD[1]],
        num_blocks,
        block_size,
        SLOTS,
        door=False,
    ).drained:
        budget += 1
    return budget


def check_largest_budget_past_the_door(answer: int | None) -> Verdict:
    """Exercise 1: 4 blocks of 3 positions, a 5-token r0: its largest budget that drains."""
    prompt, num_blocks, block_size = 5, 4, 3
    budget = largest_budget_that_drains(prompt, num_blocks, block_size)
    door = num_blocks * block_size - prompt
    return check_value(
        answer,
        budget,
        what="the largest budget that drains past the door (5-token prompt, 4 blocks of 3)",
        explain=f"The door stops at {door}, but the last token is never written: {prompt} + "
        f"{budget} - 1 = {prompt + budget - 1} positions, "
        f"{blocks_for_length(prompt + budget - 1, block_size)} blocks of {block_size}.",
    )


def smallest_pool_where_restart_largest_drains(block_size: int = 2) -> int:
    """The smallest pool through whose door the lesson's workload passes and in which restart
    with evict-the-largest drains."""
    pool = max(blocks_for_length(prompt + budget, block_size) for prompt, budget in WORKLOAD)
    while not run_rule(RESTART_RULES["largest"], WORKLOAD, pool, block_size, SLOTS).drained:
        pool += 1
    return pool


def check_smallest_pool_that_stops_the_loop(answer: int | None) -> Verdict:
    """Exercise 2: the smallest pool (blocks of 2) in which restart + evict-the-largest drains."""
    pool = smallest_pool_where_restart_largest_drains()
    loops = run_rule(RESTART_RULES["largest"], WORKLOAD, pool - 1, 2, SLOTS)
    return check_value(
        answer,
        pool,
        what="the smallest pool in which restart with evict-the-largest drains",
        explain=f"With {pool - 1} blocks the state after step {loops.repeated_at} is the state "
        f"after step {loops.first_seen}; with {pool} the run drains in "
        f"{len(run_rule(RESTART_RULES['largest'], WORKLOAD, pool, 2, SLOTS).steps)} steps.",
    )


def oldest_finishes_at(rule: str, num_requests: int, num_blocks: int) -> int | None:
    """The step at which r0 finishes, r0 then copies of r1 arriving one step apart, under a
    restart rule; None when the run loops first."""
    stream = [WORKLOAD[0]] + [WORKLOAD[1]] * (num_requests - 1)
    trace = run_rule(
        RESTART_RULES[rule], stream, num_blocks, 2, SLOTS, arrive_at=range(num_requests)
    )
    return trace.finished_at.get(0)


def check_oldest_finishes_at(answer: int | None) -> Verdict:
    """Exercise 3: 16 requests a step apart, 7 blocks, restart, youngest: r0's last step."""
    return check_value(
        answer,
        oldest_finishes_at("youngest", 16, 7),
        what="the step at which r0 finishes (restart, evict the youngest, 16 requests, 7 blocks)",
        explain="The oldest running request is never the youngest's victim: it has a row in "
        f"every step from the first, and its budget is {WORKLOAD[0][1]} tokens.",
    )

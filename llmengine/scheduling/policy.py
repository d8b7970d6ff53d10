"""How blocks are bought: the two allocation policies, each a small rule object.

A policy answers one question, how many positions a request's blocks must cover before its
next forward, and says whether it can run short (and so must be able to preempt). The
scheduler asks it and nothing else differs between them.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmengine.scheduling.request import Request


@dataclass(frozen=True, slots=True)
class Incremental:
    """Buy only what the tokens so far need: a block when a sequence crosses a boundary (or
    when its drafted tokens do: their positions are computed too).

    The pool can run dry as sequences grow, so growth must be able to preempt.
    """

    name: str = "incremental"
    preempts: bool = True
    books_ahead: bool = False  # blocks past the K/V written are given back

    def target_tokens(self, request: Request) -> int:
        return request.num_tokens + len(request.draft_token_ids)


@dataclass(frozen=True, slots=True)
class Reserve:
    """Book prompt plus the whole budget at admission: growth never needs a block.

    Nothing is ever preempted, at the price of blocks booked for tokens never generated.
    """

    name: str = "reserve"
    preempts: bool = False
    books_ahead: bool = True  # the worst case stays booked to the end

    def target_tokens(self, request: Request) -> int:
        return request.worst_case_tokens


AllocationPolicy = Incremental | Reserve

ALLOCATION_POLICIES: dict[str, AllocationPolicy] = {
    policy.name: policy for policy in (Incremental(), Reserve())
}

"""The request lifecycle: the transition table is the only authority on moves."""

from __future__ import annotations

import pytest

from llmengine.sampling import SamplingParams
from llmengine.scheduling.request import TRANSITIONS, IllegalTransition, Request, RequestState


def make(max_tokens: int = 4, eos_token_ids: tuple[int, ...] = (), **kwargs: object) -> Request:
    params = SamplingParams(max_tokens=max_tokens, **kwargs)
    return Request(
        request_id=0, prompt_token_ids=[1, 2, 3], params=params, arrival=0, block_size=4,
        eos_token_ids=eos_token_ids,
    )  # fmt: skip


def test_legal_run_through_the_table() -> None:
    request = make()
    for state in (RequestState.RUNNING, RequestState.WAITING, RequestState.RUNNING):
        request.move_to(state)
    request.move_to(RequestState.FINISHED)
    assert request.state == RequestState.FINISHED


@pytest.mark.parametrize(
    ("start", "target"),
    [
        (RequestState.WAITING, RequestState.FINISHED),
        (RequestState.FINISHED, RequestState.RUNNING),
        (RequestState.ABORTED, RequestState.WAITING),
        (RequestState.FINISHED, RequestState.ABORTED),
    ],
)
def test_illegal_moves_raise(start: RequestState, target: RequestState) -> None:
    request = make()
    request.state = start
    with pytest.raises(IllegalTransition, match=f"{start.value} -> {target.value}"):
        request.move_to(target)
    assert request.state == start


def test_every_state_is_in_the_table_and_terminal_states_have_no_exit() -> None:
    assert set(TRANSITIONS) == set(RequestState)
    assert not TRANSITIONS[RequestState.FINISHED] and not TRANSITIONS[RequestState.ABORTED]
    assert TRANSITIONS[RequestState.RUNNING][RequestState.WAITING] == "preempt"


def test_finish_reasons() -> None:
    assert make(max_tokens=1).append_token(5) == "length"
    assert make(stop_token_ids=(9,)).append_token(9) == "stop"
    assert make(eos_token_ids=(2,)).append_token(2) == "eos"
    assert make(eos_token_ids=(2,), ignore_eos=True).append_token(2) is None
    request = make()
    assert request.append_token(5) is None and request.token_ids == [1, 2, 3, 5]


def test_one_token_list_with_prompt_and_output_views() -> None:
    request = make(max_tokens=8)
    tokens = request.token_ids
    for token in (5, 6):
        request.append_token(token)
    assert request.token_ids is tokens and tokens == [1, 2, 3, 5, 6]
    assert request.prompt_token_ids == [1, 2, 3] and request.output_token_ids == [5, 6]
    assert request.num_tokens == 5 and request.num_output_tokens == 2
    request.output_token_ids.append(9)  # a copy: the request's tokens are not touched
    assert request.token_ids == [1, 2, 3, 5, 6]


def test_the_prompt_given_is_not_the_list_appended_to() -> None:
    prompt = [1, 2, 3]
    request = Request(
        request_id=0, prompt_token_ids=prompt, params=SamplingParams(), arrival=0, block_size=4
    )
    request.append_token(5)
    assert prompt == [1, 2, 3] and request.prompt_token_ids == [1, 2, 3]


def test_a_request_is_built_with_keywords_only() -> None:
    with pytest.raises(TypeError):
        Request(0, [1, 2, 3], SamplingParams(), 0, 4)  # type: ignore[misc]

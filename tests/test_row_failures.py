"""A fault while one request's row is prepared fails that request alone: the forward runs
without its row, every other row gets exactly the tokens a lone run gets, the pool stays
whole, nothing the request offered to the prefix cache stays cached without its K/V, and
the same request later succeeds. So does a fault scoring one request's prompt logprobs. A
draft proposal that raises costs its row the drafts only. Over HTTP, the poisoned stream
ends with an error event and [DONE], the others are a lone run's text."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import MODEL_NAME, TIMEOUT, SlowEngine, served, sse_payloads, wait_until
from test_step_failures import step_to_the_end

import llmengine
import llmengine.prompt_logprobs as prompt_logprobs_module
import llmengine.runner.prepare as prepare_module
import llmengine.speculative.speculator as speculator_module
from llmengine.engine import Engine
from llmengine.runner.attention import PagedRow
from llmengine.runner.draft import DraftModel
from llmengine.scheduling.decision import ScheduledRow

# Six distinct prompts of 10 to 15 tokens (full blocks of 4 to offer the prefix cache),
# greedy and seeded rows side by side; request 3 is the one poisoned.
PROMPTS = [[3 + i, *range(40 + 7 * i, 49 + 8 * i)] for i in range(6)]
PARAMS = [
    llmengine.SamplingParams(max_tokens=8, ignore_eos=True, **extra)
    for extra in [{}, {"temperature": 0.9, "seed": 3}, {}, {}, {"top_k": 20, "seed": 8,
                  "temperature": 1.1}, {"presence_penalty": 0.5}]
]  # fmt: skip
POOL = {"num_blocks": 96, "block_size": 4, "num_slots": 6, "enable_prefix_caching": True}
DOOMED = 3


def lone_runs(model: llmengine.Llama, **options: Any) -> list[list[int]]:
    """Each request's tokens when it runs alone in a fresh engine."""
    return [
        Engine(model, **{**POOL, **options}).generate([prompt], params)[0]
        for prompt, params in zip(PROMPTS, PARAMS, strict=True)
    ]


def poison(
    monkeypatch: pytest.MonkeyPatch,
    doomed: Callable[[ScheduledRow], bool],
    broken: Callable[[ScheduledRow], PagedRow] | None = None,
) -> None:
    """The runner's per-row preparation (`paged_row`) fails for the rows `doomed` picks: it
    raises, or returns `broken(row)`, inputs that cannot be packed."""
    real = prepare_module.paged_row

    def paged_row(row: ScheduledRow) -> PagedRow:
        if not doomed(row):
            return real(row)
        if broken is None:
            raise RuntimeError("poisoned")
        return broken(row)

    monkeypatch.setattr(prepare_module, "paged_row", paged_row)


def run_poisoned(engine: Engine, ids: list[int]) -> tuple[list[list[int]], dict[int, str]]:
    failed = step_to_the_end(engine)
    return [engine.release(request_id).output_token_ids for request_id in ids], failed


@pytest.mark.parametrize("when", ["prefill", "decode"])
def test_a_row_whose_inputs_fail_fails_its_request_alone(model, monkeypatch, when) -> None:
    expected = lone_runs(model)
    engine = Engine(model, **POOL)
    ids = engine.add_requests(PROMPTS, PARAMS)
    at_prefill = when == "prefill"
    poison(
        monkeypatch,
        lambda row: (
            row.request.request_id == ids[DOOMED]
            and (row.is_prefill if at_prefill else row.request.num_output_tokens == 2)
        ),
    )
    outputs, failed = run_poisoned(engine, ids)
    assert list(failed) == [ids[DOOMED]]
    assert failed[ids[DOOMED]] == "preparing its inputs failed: poisoned"
    assert outputs[DOOMED] == ([] if at_prefill else expected[DOOMED][:2])
    assert [out for i, out in enumerate(outputs) if i != DOOMED] == [
        out for i, out in enumerate(expected) if i != DOOMED
    ]
    engine.check_integrity()
    assert engine.num_free_blocks == engine.num_blocks
    monkeypatch.undo()
    # Again, clean: a prefill that never ran left no block cached; a decode that did not run
    # spares the prompt's blocks, which its prefill filled.
    again = engine.add_request(PROMPTS[DOOMED], PARAMS[DOOMED])
    first = engine.step()
    assert (first.cached_tokens == 0) == at_prefill
    while engine.has_unfinished():
        engine.step()
    assert engine.release(again).output_token_ids == expected[DOOMED]


def test_inputs_that_cannot_be_packed_are_traced_to_their_row(model, monkeypatch) -> None:
    """A block table too short for its row's positions raises inside the packing of every
    row's inputs together; packed one by one, the fault is that row's alone."""
    expected = lone_runs(model)
    engine = Engine(model, **POOL)
    ids = engine.add_requests(PROMPTS, PARAMS)

    def short_table(row: ScheduledRow) -> PagedRow:
        return PagedRow(row.token_ids, row.start_position, row.request.block_table.block_ids[:1])

    poison(monkeypatch, lambda row: row.request.request_id == ids[DOOMED] and not row.is_prefill,
           short_table)  # fmt: skip
    outputs, failed = run_poisoned(engine, ids)
    assert list(failed) == [ids[DOOMED]] and "row needs" in failed[ids[DOOMED]]
    assert outputs[DOOMED] == expected[DOOMED][:1]
    assert outputs[:DOOMED] + outputs[DOOMED + 1 :] == expected[:DOOMED] + expected[DOOMED + 1 :]
    assert engine.num_free_blocks == engine.num_blocks


def test_a_row_that_shares_a_left_out_rows_blocks_fails_with_it(model, monkeypatch) -> None:
    """Two requests with one prompt, admitted in one decision: the second takes the first's
    offered blocks as prefix-cache hits, K/V the first's row was to write. The first's inputs
    fail, so the second would read blocks never written: it fails too, saying why, and the
    four others are untouched; afterwards the prompt finds nothing cached and runs clean."""
    prompts = [*PROMPTS[:DOOMED], PROMPTS[DOOMED], *PROMPTS[DOOMED:]]
    params = [*PARAMS[:DOOMED], PARAMS[DOOMED], *PARAMS[DOOMED:]]
    expected = lone_runs(model)
    engine = Engine(model, **POOL)
    ids = engine.add_requests(prompts, params)
    poison(monkeypatch, lambda row: row.request.request_id == ids[DOOMED])
    outputs, failed = run_poisoned(engine, ids)
    assert failed == {
        ids[DOOMED]: "preparing its inputs failed: poisoned",
        ids[DOOMED + 1]: f"its cached prefix was to be computed by request {ids[DOOMED]}, "
        "whose inputs failed",
    }
    assert outputs[DOOMED] == outputs[DOOMED + 1] == []
    assert outputs[:DOOMED] + outputs[DOOMED + 2 :] == expected[:DOOMED] + expected[DOOMED + 1 :]
    assert engine.num_free_blocks == engine.num_blocks
    monkeypatch.undo()
    again = engine.add_request(PROMPTS[DOOMED], PARAMS[DOOMED])
    assert engine.step().cached_tokens == 0
    while engine.has_unfinished():
        engine.step()
    assert engine.release(again).output_token_ids == expected[DOOMED]


# Prompts that repeat themselves, so prompt lookup finds drafts from the first decode on.
LOOPING = [[5 + i, 6, 7, 5 + i, 6, 7, 5 + i, 6] for i in range(6)]
GREEDY = llmengine.SamplingParams(max_tokens=12, ignore_eos=True)


def drafting_run(engine: Engine) -> tuple[list[list[int]], set[int]]:
    """Every request's tokens, and the requests whose rows carried drafts."""
    ids = engine.add_requests(LOOPING, GREEDY)
    drafted: set[int] = set()
    while engine.has_unfinished():
        outcome = engine.step()
        engine.check_integrity()
        assert not outcome.failed
        drafted |= set(outcome.drafts)
    return [engine.release(request_id).output_token_ids for request_id in ids], drafted


def test_a_guess_that_raises_costs_its_request_its_drafts_only(model, monkeypatch) -> None:
    expected = [Engine(model, num_blocks=64).generate([prompt], GREEDY)[0] for prompt in LOOPING]
    real = speculator_module.propose_ngram

    def propose(token_ids: list[int], k: int) -> list[int]:
        if token_ids[0] == LOOPING[DOOMED][0]:
            raise RuntimeError("poisoned")
        return real(token_ids, k)

    monkeypatch.setattr(speculator_module, "propose_ngram", propose)
    engine = Engine(model, num_blocks=64, num_slots=6, speculative="ngram",
                    num_speculative_tokens=3)  # fmt: skip
    outputs, drafted = drafting_run(engine)
    assert outputs == expected
    assert DOOMED not in drafted and len(drafted) == len(LOOPING) - 1


@pytest.fixture(scope="module")
def self_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llmengine.speculative.draft import save_self_draft

    folder = tmp_path_factory.mktemp("self-draft")
    return save_self_draft(llmengine.embedded_model_path(), folder, num_layers=2)


def test_a_draft_model_that_raises_for_one_row_costs_it_its_drafts_only(
    model, monkeypatch, self_draft: Path
) -> None:
    """The draft model's catch-up raises for one row: proposing together fails, one by one
    tells whose, and that row goes on without drafts; every text is a lone run's."""
    expected = [Engine(model, num_blocks=64).generate([prompt], GREEDY)[0] for prompt in LOOPING]
    real = DraftModel._catch_up_row

    def catch_up(self: DraftModel, row: ScheduledRow) -> PagedRow:
        if row.request.prompt_token_ids[0] == LOOPING[DOOMED][0]:
            raise RuntimeError("poisoned")
        return real(self, row)

    monkeypatch.setattr(DraftModel, "_catch_up_row", catch_up)
    engine = Engine(model, num_blocks=64, num_slots=6, speculative=str(self_draft),
                    num_speculative_tokens=3)  # fmt: skip
    outputs, drafted = drafting_run(engine)
    assert outputs == expected
    assert DOOMED not in drafted and len(drafted) == len(LOOPING) - 1


def stream_text(url: str, prompt: str) -> list[Any]:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 24, "temperature": 0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=TIMEOUT) as response:
        assert response.status_code == 200
        return sse_payloads(response.iter_lines())


def text_of(payloads: list[Any]) -> str:
    return "".join(p["choices"][0]["text"] for p in payloads if p.get("choices"))


class Slower(SlowEngine):
    delay = 0.01  # a step takes long enough for six streams to overlap


def test_a_poisoned_stream_among_six_ends_alone(model, tokenizer, monkeypatch) -> None:
    """Six streams at once, one whose row cannot be prepared at its fourth token while all
    six run: it gets an error event, then [DONE]; the five others are byte for byte what
    each gets alone, and the server serves the poisoned prompt again afterwards."""
    prompts = ["ROMEO:", "JULIET:", "First Citizen:", "MENENIUS:", "Nurse:", "KING HENRY:"]
    engine = Slower(model, num_blocks=96, block_size=16, num_slots=6)
    doomed_ids = tokenizer.encode(prompts[DOOMED])
    fired: list[int] = []

    def doomed(row: ScheduledRow) -> bool:
        hit = (row.request.prompt_token_ids == doomed_ids and engine.num_running == 6
               and row.request.num_output_tokens >= 3)  # fmt: skip
        if hit:
            fired.append(row.request.request_id)
        return hit

    with served(engine, tokenizer) as server:
        alone = [text_of(stream_text(server.url, prompt)) for prompt in prompts]
        poison(monkeypatch, doomed)
        results: list[list[Any]] = [[] for _ in prompts]

        def run(index: int) -> None:
            results[index] = stream_text(server.url, prompts[index])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT)
        assert fired, "the six streams never ran together"
        last = results[DOOMED][-1]
        assert "preparing its inputs failed: poisoned" in last["error"]["message"]
        assert alone[DOOMED].startswith(text_of(results[DOOMED]))
        for index, payloads in enumerate(results):
            if index != DOOMED:
                assert text_of(payloads) == alone[index]
                assert payloads[-1]["choices"][0]["finish_reason"] == "length"
        monkeypatch.undo()
        assert text_of(stream_text(server.url, prompts[DOOMED])) == alone[DOOMED]
        assert wait_until(lambda: not engine.has_unfinished() and not engine._requests)
        engine.check_integrity()
        assert engine.num_free_blocks == engine.num_blocks


def test_a_prompt_whose_scoring_fails_fails_alone(model, monkeypatch) -> None:
    """Six requests that want their prompts' logprobs; scoring one of them raises: that
    request fails before it samples, the five others get a lone run's tokens and prompt
    logprobs."""
    params = [llmengine.SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=1)] * 6

    def run_all(engine: Engine, prompts: list[list[int]]) -> tuple[list, dict, dict]:
        ids = engine.add_requests(prompts, params[: len(prompts)])
        scored: dict[int, list] = {}
        failed: dict[int, str] = {}
        while engine.has_unfinished():
            outcome = engine.step()
            engine.check_integrity()
            failed.update(outcome.failed)
            for request_id, entries in outcome.prompt_logprobs.items():
                scored.setdefault(request_id, []).extend(entries)
        outputs = [engine.release(request_id).output_token_ids for request_id in ids]
        return outputs, [scored.get(request_id) for request_id in ids], failed

    alone = [run_all(Engine(model, **POOL), [prompt]) for prompt in PROMPTS]
    real = prompt_logprobs_module.token_logprobs
    doomed_token = PROMPTS[DOOMED][5]  # a prompt token of the doomed request's alone

    def token_logprobs(logits, token, k):  # noqa: ANN001, ANN202
        if token == doomed_token:
            raise RuntimeError("poisoned")
        return real(logits, token, k)

    monkeypatch.setattr(prompt_logprobs_module, "token_logprobs", token_logprobs)
    engine = Engine(model, **POOL)
    outputs, scored, failed = run_all(engine, PROMPTS)
    assert failed == {DOOMED: "scoring its prompt failed: poisoned"}
    assert outputs[DOOMED] == [] and scored[DOOMED] is None
    for index, (output, entries, _) in enumerate(alone):
        if index != DOOMED:  # the same tokens; logprobs as a batch's float sums give them
            assert outputs[index] == output[0]
            assert [(e.token_id, [t for t, _ in e.top]) for e in scored[index]] == [
                (e.token_id, [t for t, _ in e.top]) for e in entries[0]
            ]
            assert [e.logprob for e in scored[index]] == pytest.approx(
                [e.logprob for e in entries[0]], abs=1e-4
            )
    assert engine.num_free_blocks == engine.num_blocks

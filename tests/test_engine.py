"""The engine on real weights: same text whatever the pool, resume not restart, abort, errors."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from engine_runs import prompts_for, run_checked
from hf_llama import hf_greedy, save_random_llama

import llmengine
from llmengine.engine import Engine
from llmengine.runner import model_runner as runner_module
from llmengine.sampling import SamplingParams
from llmengine.scheduling.request import Request, RequestState
from llmengine.scheduling.scheduler import Scheduler


@pytest.fixture(scope="module")
def random_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    folder = tmp_path_factory.mktemp("engine-llama")
    hf_model = save_random_llama(folder, seed=3, vocab_size=97, num_hidden_layers=2)
    return folder, hf_model


@pytest.fixture(scope="module")
def model(random_checkpoint: tuple[Path, object]) -> llmengine.Llama:
    return llmengine.load_model(random_checkpoint[0])


GREEDY = SamplingParams(max_tokens=20, ignore_eos=True)


def test_cramped_and_roomy_engines_return_the_same_tokens_as_transformers(
    model: llmengine.Llama, random_checkpoint: tuple[Path, object]
) -> None:
    prompts = prompts_for(0, 6, model.config.vocab_size)
    roomy, roomy_evictions = run_checked(
        Engine(model, num_blocks=64, block_size=4, num_slots=6), prompts, GREEDY
    )
    cramped, cramped_evictions = run_checked(
        Engine(model, num_blocks=9, block_size=4, num_slots=6), prompts, GREEDY
    )
    assert roomy_evictions == 0 and cramped_evictions >= 3
    assert cramped == roomy
    hf_model = random_checkpoint[1]
    for prompt, tokens in zip(prompts, roomy, strict=True):
        assert tokens == hf_greedy(hf_model, torch.tensor([prompt]), 20)[0]


def test_reserve_and_incremental_policies_agree(model: llmengine.Llama) -> None:
    prompts = prompts_for(1, 5, model.config.vocab_size)
    reserve, _ = run_checked(
        Engine(model, num_blocks=12, block_size=4, num_slots=5, policy="reserve"), prompts, GREEDY
    )
    incremental, _ = run_checked(
        Engine(model, num_blocks=12, block_size=4, num_slots=5), prompts, GREEDY
    )
    assert reserve == incremental


def test_seeded_sampling_does_not_depend_on_pool_or_preemption(model: llmengine.Llama) -> None:
    prompts = prompts_for(2, 5, model.config.vocab_size)
    params = [
        SamplingParams(max_tokens=16, temperature=0.9, top_k=20, seed=s, ignore_eos=True)
        for s in range(5)
    ]
    roomy = Engine(model, num_blocks=64, block_size=4, num_slots=5).generate(prompts, params)
    cramped_engine = Engine(model, num_blocks=8, block_size=4, num_slots=5)
    assert cramped_engine.generate(prompts, params) == roomy


def test_resumed_request_prefills_prompt_plus_everything_it_generated(
    model: llmengine.Llama, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fails if a resume restarts from the prompt or re-prefills only the prompt (Day 33)."""
    seen: list[list] = []
    real_forward = runner_module.paged_forward

    def recording_forward(model, cache, rows, *rest):  # noqa: ANN001, ANN202
        seen.append([(list(row.token_ids), row.start_position) for row in rows])
        return real_forward(model, cache, rows, *rest)

    monkeypatch.setattr(runner_module, "paged_forward", recording_forward)
    engine = Engine(model, num_blocks=8, block_size=4, num_slots=4)
    prompts = prompts_for(4, 4, model.config.vocab_size, low=5, high=5)
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    resumed = 0
    while engine.has_unfinished():
        outcome = engine.step()
        for row_tokens, start in seen[-1]:
            if start == 0 and len(row_tokens) > 5:
                request = next(
                    engine.request(i)
                    for i in ids
                    if engine.request(i).prompt_token_ids == row_tokens[:5]
                )
                resumed += 1
                assert row_tokens == request.token_ids[: len(row_tokens)]
                assert len(row_tokens) == len(request.output_token_ids) - 1 + 5
        assert outcome.recomputed_tokens == sum(
            len(t) for t, s in seen[-1] if s == 0 and len(t) > 5
        )
    assert resumed >= 2
    assert all(len(engine.request(i).output_token_ids) == 20 for i in ids)


def test_outcome_itemises_positions_by_row(model: llmengine.Llama) -> None:
    """A decode row is one position, a prefill row its whole sequence, a resume all recomputed."""
    engine = Engine(model, num_blocks=8, block_size=4, num_slots=4)
    prompts = prompts_for(4, 4, model.config.vocab_size, low=5, high=5)
    for prompt in prompts:
        engine.add_request(prompt, GREEDY)
    resumed = 0
    while engine.has_unfinished():
        outcome = engine.step()
        assert outcome.row_positions.keys() == outcome.tokens.keys()
        assert sum(outcome.row_positions.values()) == outcome.forward_tokens
        assert set(outcome.resumed) <= set(outcome.admitted)
        assert outcome.recomputed_tokens == sum(outcome.row_positions[r] for r in outcome.resumed)
        for request_id, positions in outcome.row_positions.items():
            request = engine.request(request_id)
            prefill = request.num_tokens - 1 if request_id in outcome.admitted else 1
            assert positions == prefill
            assert (request_id in outcome.resumed) == (positions > 5)
        resumed += len(outcome.resumed)
    assert resumed >= 2


def test_abort_waiting_running_and_preempted(model: llmengine.Llama) -> None:
    engine = Engine(model, num_blocks=6, block_size=4, num_slots=2)
    prompts = prompts_for(5, 4, model.config.vocab_size, low=6, high=6)
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    a, b, c, d = (engine.add_request(p, params) for p in prompts)
    engine.step()
    assert engine.abort(c) is True  # waiting
    while engine.request(b).num_preemptions == 0:
        engine.step()
    assert engine.request(b).state == RequestState.WAITING
    assert engine.abort(b) is True  # preempted
    assert engine.abort(a) is True  # running
    engine.check_integrity()
    assert engine.num_free_blocks == 6
    assert [engine.request(i).state for i in (a, b, c)] == [RequestState.ABORTED] * 3
    with pytest.raises(ValueError, match="already aborted"):
        engine.abort(a)
    while engine.has_unfinished():
        engine.step()
    assert len(engine.request(d).output_token_ids) == 10


def test_abort_of_a_running_request_frees_its_blocks_and_slot_at_once(
    model: llmengine.Llama,
) -> None:
    engine = Engine(model, num_blocks=8, block_size=4, num_slots=2)
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    keep, stop = (
        engine.add_request(p, params)
        for p in prompts_for(8, 2, model.config.vocab_size, low=6, high=6)
    )
    engine.step()
    assert engine.num_free_blocks == 4 and engine.num_running == engine.num_slots
    assert engine.abort(stop) is True
    engine.check_integrity()
    assert engine.num_free_blocks == 6 and engine.num_running == engine.num_slots - 1
    while engine.has_unfinished():
        assert stop not in engine.step().tokens
    assert len(engine.request(keep).output_token_ids) == 10


def test_abort_after_the_last_token_returns_false_and_changes_nothing(
    model: llmengine.Llama,
) -> None:
    """A client's disconnect can lose the race against its last token: no error, no effect."""
    engine = Engine(model, num_blocks=8, block_size=4, num_slots=2)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    done, other = (engine.add_request(p, params) for p in ([1, 2, 3], [4, 5, 6, 7, 8, 9]))
    while engine.request(done).state != RequestState.FINISHED:
        engine.step()
    tokens = engine.request(done).output_token_ids
    assert engine.abort(done) is False
    assert engine.request(done).state == RequestState.FINISHED
    assert engine.request(done).output_token_ids == tokens
    assert engine.request(other).state == RequestState.FINISHED  # same budget, same steps
    assert engine.num_free_blocks == 8 and not engine.has_unfinished()
    (ran,) = Engine(model, num_blocks=8, block_size=4).generate([[1, 2, 3]], params)
    assert ran == tokens


def test_abort_of_an_id_never_issued_raises_key_error(model: llmengine.Llama) -> None:
    engine = Engine(model, num_blocks=8, block_size=4, num_slots=2)
    with pytest.raises(KeyError, match="no request 0"):
        engine.abort(0)
    rid = engine.add_request([1, 2, 3], SamplingParams(max_tokens=2))
    for never in (rid + 1, -1):
        with pytest.raises(KeyError, match=f"no request {never}"):
            engine.abort(never)
    assert engine.has_unfinished() and engine.request(rid).state == RequestState.WAITING


def test_abort_of_a_request_generate_already_returned_is_false(model: llmengine.Llama) -> None:
    engine = Engine(model, num_blocks=8, block_size=4, num_slots=2)
    engine.generate([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=2))
    assert [engine.abort(0), engine.abort(1)] == [False, False]
    with pytest.raises(KeyError):
        engine.abort(2)


def test_the_step_that_finishes_the_last_request_frees_the_whole_pool(
    model: llmengine.Llama,
) -> None:
    engine = Engine(model, num_blocks=8, block_size=4, num_slots=2)
    prompts = prompts_for(9, 3, model.config.vocab_size, low=3, high=7)
    budgets = [2, 5, 3]
    for prompt, budget in zip(prompts, budgets, strict=True):
        engine.add_request(prompt, SamplingParams(max_tokens=budget, ignore_eos=True))
    outcomes = []
    while engine.has_unfinished():
        outcomes.append(engine.step())
        engine.check_integrity()
        held = sum(len(r.block_table.block_ids) for r in engine.scheduler.running)
        assert engine.num_free_blocks == engine.num_blocks - held
    assert all(outcome.rows for outcome in outcomes)
    assert sum(len(outcome.tokens) for outcome in outcomes) == sum(budgets)
    assert outcomes[-1].finished and engine.num_free_blocks == engine.num_blocks
    with pytest.raises(RuntimeError, match="nothing to step"):
        engine.step()


def test_unknown_policy_is_refused_at_construction(model: llmengine.Llama) -> None:
    with pytest.raises(ValueError, match=r"policy must be one of .*'fifo'"):
        Engine(model, num_blocks=8, block_size=4, policy="fifo")


def test_prompt_that_exactly_fills_a_block(model: llmengine.Llama, random_checkpoint) -> None:
    prompt = prompts_for(6, 1, model.config.vocab_size, low=8, high=8)
    engine = Engine(model, num_blocks=8, block_size=4, num_slots=1)
    rid = engine.add_request(prompt[0], SamplingParams(max_tokens=6, ignore_eos=True))
    first = engine.step()
    assert first.forward_tokens == 8 and engine.num_free_blocks == 6
    engine.step()  # position 8 opens the third block
    assert engine.num_free_blocks == 5
    while engine.has_unfinished():
        engine.step()
    expected = hf_greedy(random_checkpoint[1], torch.tensor(prompt), 6)[0]
    assert engine.request(rid).output_token_ids == expected


def test_eos_and_stop_tokens_finish_and_free_blocks(model: llmengine.Llama) -> None:
    prompt = prompts_for(7, 1, model.config.vocab_size)[0]
    free_run = Engine(model, num_blocks=16, block_size=4).generate([prompt], GREEDY)[0]
    stop = free_run[5]
    engine = Engine(model, num_blocks=16, block_size=4)
    out = engine.generate([prompt], SamplingParams(max_tokens=20, stop_token_ids=(stop,)))[0]
    assert out == free_run[: free_run.index(stop) + 1]
    assert engine.num_free_blocks == 16
    engine.eos_token_ids = (stop,)
    assert engine.generate([prompt], SamplingParams(max_tokens=20))[0] == out
    assert engine.num_free_blocks == 16


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ([], GREEDY, "empty"),
        ([1, 2, 500], GREEDY, "outside the vocabulary"),
        ([1, -1], GREEDY, "outside the vocabulary"),
        ([1] * 10, SamplingParams(max_tokens=30), "pool has 8"),
    ],
)
def test_bad_input_is_refused_and_the_engine_still_serves(
    model: llmengine.Llama, prompt: list[int], params: SamplingParams, message: str
) -> None:
    engine = Engine(model, num_blocks=8, block_size=4, num_slots=2)
    with pytest.raises(ValueError, match=message):
        engine.add_request(prompt, params)
    assert not engine.has_unfinished() and engine.num_free_blocks == 8
    assert len(engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4))[0]) <= 4


def test_max_tokens_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)


def test_stress_many_requests_tiny_pool(model: llmengine.Llama) -> None:
    for seed in (11, 12, 13):
        rng = random.Random(seed)
        prompts = prompts_for(seed, 24, model.config.vocab_size, low=1, high=20)
        params = [SamplingParams(max_tokens=rng.randint(1, 24), ignore_eos=True) for _ in prompts]
        roomy = Engine(model, num_blocks=256, block_size=4, num_slots=24).generate(prompts, params)
        cramped = Engine(model, num_blocks=12, block_size=4, num_slots=6)
        ids = [cramped.add_request(p, q) for p, q in zip(prompts, params, strict=True)]
        evictions = 0
        while cramped.has_unfinished():
            evictions += len(cramped.step().evicted)
            cramped.check_integrity()
        assert evictions > 10
        assert [cramped.request(i).output_token_ids for i in ids] == roomy
        assert cramped.num_free_blocks == 12 and cramped.num_running == 0


def test_embedded_model_text_is_the_same_cramped_roomy_and_in_transformers() -> None:
    """The shipped model through the engine: same text whatever the pool, equal to transformers."""
    import transformers

    model, tokenizer = llmengine.load_model(), llmengine.load_tokenizer()
    prompts = ["ROMEO:\n", "JULIET:\nO", "HAMLET:\nTo be", "KING:\nWhat"]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    roomy = Engine(model, num_blocks=64, block_size=4, num_slots=4, tokenizer=tokenizer)
    cramped = Engine(model, num_blocks=10, block_size=4, num_slots=4, tokenizer=tokenizer)
    roomy_text = roomy.generate_text(prompts, params)
    cramped_ids = [cramped.add_request(tokenizer.encode(p), params) for p in prompts]
    evictions = 0
    while cramped.has_unfinished():
        evictions += len(cramped.step().evicted)
    assert evictions > 0
    cramped_text = [
        tokenizer.decode(cramped.request(i).output_token_ids, skip_special_tokens=True)
        for i in cramped_ids
    ]
    assert cramped_text == roomy_text
    reference = transformers.AutoModelForCausalLM.from_pretrained(llmengine.embedded_model_path())
    for prompt, text in zip(prompts, roomy_text, strict=True):
        expected = hf_greedy(reference.eval(), torch.tensor([tokenizer.encode(prompt)]), 24)[0]
        assert text == tokenizer.decode(expected, skip_special_tokens=True)


def test_an_engine_subclass_runs_its_own_scheduler_class(model: llmengine.Llama) -> None:
    victims: list[int] = []

    class Recording(Scheduler):
        def select_victim(self, candidates: list[Request]) -> Request:
            victims.append(candidates[-1].request_id)
            return candidates[-1]

    class RecordingEngine(Engine):
        scheduler_class = Recording

    prompts = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    engine = RecordingEngine(model, num_blocks=8, block_size=4, num_slots=2)
    outputs = engine.generate(prompts, GREEDY)
    assert isinstance(engine.scheduler, Recording) and victims
    roomy = Engine(model, num_blocks=16, block_size=4, num_slots=2)
    assert outputs == roomy.generate(prompts, GREEDY)


def test_release_hands_back_a_done_record_once_and_refuses_an_unfinished_one(
    model: llmengine.Llama,
) -> None:
    engine = Engine(model, num_blocks=8, block_size=4, num_slots=2)
    done, stopped = engine.add_requests([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=3))
    with pytest.raises(ValueError, match="still waiting"):
        engine.release(done)
    engine.step()
    assert engine.abort(stopped) is True
    while engine.has_unfinished():
        engine.step()
    record = engine.release(done)
    assert record.state == RequestState.FINISHED and len(record.output_token_ids) == 3
    assert engine.release(stopped).state == RequestState.ABORTED
    assert engine._requests == {}
    assert [engine.abort(done), engine.abort(stopped)] == [False, False]
    with pytest.raises(KeyError):
        engine.release(done)


def test_add_requests_is_all_or_nothing(model: llmengine.Llama) -> None:
    engine = Engine(model, num_blocks=8, block_size=4, num_slots=2)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_requests([[1, 2], [3, 4], [10**6]], SamplingParams(max_tokens=2))
    assert not engine.has_unfinished() and engine._requests == {}
    assert engine.num_free_blocks == engine.num_blocks

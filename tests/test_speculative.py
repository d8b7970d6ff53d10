"""Speculative decoding by prompt lookup: the proposer, the verification rule (exact for greedy,
distribution-preserving when sampled), and the engine keeping the same text through
preemption, swap, prefix caching and chunked prefill."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from hf_llama import save_random_llama

import llmengine
from llmengine import Engine, SamplingParams
from llmengine.scheduling.request import Request
from llmengine.speculative.ngram import propose_ngram
from llmengine.speculative.verify import can_speculate, cut_at_finish, verify_drafts

# Chi-square critical values at a 1e-4 false-alarm rate, by degrees of freedom.
CHI2_CRITICAL = {3: 21.108, 5: 25.745, 7: 29.878}


def chi_square(counts: torch.Tensor, expected: torch.Tensor) -> float:
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


# -- the proposer --------------------------------------------------------------------------


def test_prompt_lookup_proposes_what_followed_the_latest_longest_match() -> None:
    assert propose_ngram([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 2) == [7, 1]
    assert propose_ngram([5, 1, 2, 8, 1, 2], 3) == [8, 1, 2]
    # The longest suffix wins over a later, shorter match.
    assert propose_ngram([1, 2, 3, 4, 0, 3, 5, 1, 2, 3], 1, max_ngram=3) == [4]
    assert propose_ngram([1, 2, 3, 4, 0, 3, 5, 1, 2, 3], 1, max_ngram=1) == [5]
    assert propose_ngram([1, 1, 1, 1], 3) == [1]  # overlapping: what followed ends the text
    assert propose_ngram([1, 2, 3, 4], 3) == []
    assert propose_ngram([7], 3) == []
    assert propose_ngram([1, 2, 1, 2], 0) == []


# -- the rule ------------------------------------------------------------------------------


def logits_for(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_greedy_keeps_the_drafts_the_argmax_agrees_with_then_adds_its_own() -> None:
    greedy = SamplingParams()
    logits = logits_for([[0, 5, 0, 0], [0, 0, 5, 0], [5, 0, 0, 0], [0, 0, 0, 5]])
    assert verify_drafts(logits, [1, 2, 3], greedy, None) == [1, 2, 0]
    assert verify_drafts(logits, [1, 2, 0], greedy, None) == [1, 2, 0, 3]
    assert verify_drafts(logits, [2, 2, 0], greedy, None) == [1]
    with pytest.raises(ValueError, match="2 drafts need 3 rows"):
        verify_drafts(logits, [1, 2], greedy, None)


def test_the_finishing_token_ends_what_is_kept() -> None:
    params = SamplingParams(max_tokens=10, stop_token_ids=(4,))

    def request(generated: int, eos: tuple[int, ...] = ()) -> Request:
        made = Request(
            request_id=0, prompt_token_ids=[9], params=params, arrival=0, block_size=4,
            eos_token_ids=eos,
        )  # fmt: skip
        made.token_ids += [9] * generated
        return made

    assert cut_at_finish([1, 4, 2], request(0)) == [1, 4]
    assert cut_at_finish([1, 2, 3], request(0, (2,))) == [1, 2]
    assert cut_at_finish([1, 2, 3], request(8)) == [1, 2]  # the 10th token is the last
    assert cut_at_finish([1, 2, 3], request(0)) == [1, 2, 3]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=4),
        SamplingParams(temperature=1.3, top_p=0.8),
        SamplingParams(temperature=1.0, min_p=0.2, logit_bias={0: 1.5, 3: -0.5}),
    ],
)
def test_sampled_verification_draws_each_token_from_the_models_distribution(params) -> None:
    """Whatever the drafts, the first token kept is distributed as p0, and the second, when
    the first is the draft, as p1: checked by chi-square over 10,000 seeded draws."""
    from llmengine.sampling import candidate_distribution

    torch.manual_seed(0)
    vocab = 6
    logits = torch.randn(3, vocab) * 1.5
    drafts = [2, 4]
    dists = []
    for position in range(3):
        tokens, probs = candidate_distribution(logits[position], params)
        full = torch.zeros(vocab)
        full[tokens] = probs
        dists.append(full)
    trials = 10_000
    first = torch.zeros(vocab)
    second = torch.zeros(vocab)
    generator = torch.Generator()
    for trial in range(trials):
        generator.manual_seed(trial)
        kept = verify_drafts(logits, drafts, params, generator)
        first[kept[0]] += 1
        if kept[0] == drafts[0]:
            second[kept[1]] += 1
    critical = CHI2_CRITICAL[5]
    assert chi_square(first, trials * dists[0]) < critical
    assert chi_square(second, second.sum() * dists[1]) < critical
    # The test can fail: always keeping the drafts is far from p0.
    always = torch.zeros(vocab)
    always[drafts[0]] = trials
    assert chi_square(always, trials * dists[0]) > critical


def test_rows_whose_sampler_moves_one_token_at_a_time_do_not_speculate() -> None:
    assert can_speculate(SamplingParams(temperature=0.8, seed=3))
    assert not can_speculate(SamplingParams(presence_penalty=0.5))
    assert not can_speculate(SamplingParams(logprobs=2))
    assert not can_speculate(SamplingParams(constraint=llmengine.Constraint.regex("a+")))


# -- the engine ----------------------------------------------------------------------------


def run(engine: Engine, prompts, params) -> tuple[list[list[int]], int, int, int]:
    """Outputs, forwards, drafted and kept tokens; the integrity checked at every step."""
    ids = engine.add_requests(prompts, params)
    forwards = proposed = accepted = 0
    while engine.has_unfinished():
        outcome = engine.step()
        engine.check_integrity()
        forwards += 1
        proposed += outcome.num_draft_tokens
        accepted += outcome.num_accepted_tokens
        for request_id in outcome.tokens:
            assert outcome.new_tokens(request_id)
    return [engine.release(i).output_token_ids for i in ids], forwards, proposed, accepted


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    texts = ["ROMEO:\n", "KING HENRY:\nMy lord", "First Citizen:\n", "JULIET:\nO Romeo", "A"]
    return [tokenizer.encode(text) for text in texts]


def test_greedy_text_is_the_text_without_speculation_and_takes_fewer_forwards(
    model, prompts
) -> None:
    greedy = SamplingParams(max_tokens=80)
    plain, plain_forwards, _, _ = run(Engine(model, num_blocks=128), prompts, greedy)
    for k in (1, 3, 6):
        engine = Engine(model, num_blocks=128, speculative="ngram", num_speculative_tokens=k)
        outputs, forwards, proposed, accepted = run(engine, prompts, greedy)
        assert outputs == plain, k
        assert 0 < accepted <= proposed
        assert forwards < plain_forwards


@pytest.mark.parametrize(
    "options",
    [
        {"num_blocks": 30, "block_size": 4, "preemption": "recompute"},
        {"num_blocks": 30, "block_size": 4, "preemption": "swap", "swap_blocks": 64},
        {"num_blocks": 256, "block_size": 4, "enable_prefix_caching": True},
        {"num_blocks": 256, "block_size": 4, "max_num_batched_tokens": 12},
        {"num_blocks": 256, "block_size": 4, "policy": "reserve"},
    ],
    ids=["recompute", "swap", "prefix-caching", "chunked", "reserve"],
)
def test_preemption_caching_and_budgets_keep_the_greedy_text(model, prompts, options) -> None:
    greedy = SamplingParams(max_tokens=60)
    batch = prompts + prompts  # the repeats share prefixes for the cache
    plain, *_ = run(Engine(model, num_blocks=256, block_size=4, num_slots=10), batch, greedy)
    engine = Engine(model, num_slots=10, speculative="ngram", num_speculative_tokens=4, **options)
    evicted = []
    ids = engine.add_requests(batch, greedy)
    while engine.has_unfinished():
        outcome = engine.step()
        engine.check_integrity()
        evicted += outcome.evicted
        budget = options.get("max_num_batched_tokens")
        assert budget is None or outcome.forward_tokens <= budget
    assert [engine.release(i).output_token_ids for i in ids] == plain
    assert bool(evicted) == ("preemption" in options)


def test_max_tokens_and_stop_tokens_cut_a_run_of_kept_drafts(model, prompts) -> None:
    for params in (
        SamplingParams(max_tokens=13),
        SamplingParams(max_tokens=60, stop_token_ids=(13,)),
    ):
        plain, *_ = run(Engine(model, num_blocks=128), prompts, params)
        engine = Engine(model, num_blocks=128, speculative="ngram", num_speculative_tokens=6)
        outputs, *_ = run(engine, prompts, params)
        assert outputs == plain
        for tokens in outputs:
            assert len(tokens) <= params.max_tokens
            assert not set(params.stop_token_ids) & set(tokens[:-1])
    assert any(tokens[-1] == 13 for tokens in outputs)  # the stop token did end some


def test_a_held_out_random_model_keeps_its_text_and_rarely_agrees(
    tmp_path: Path, tokenizer, prompts
) -> None:
    save_random_llama(tmp_path, seed=5, vocab_size=2048, bos_token_id=0, eos_token_id=0)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(llmengine.embedded_model_path() / name, tmp_path / name)
    model = llmengine.load_model(tmp_path)
    greedy = SamplingParams(max_tokens=40, ignore_eos=True)
    plain, *_ = run(Engine(model, num_blocks=128), prompts, greedy)
    engine = Engine(model, num_blocks=128, speculative="ngram", num_speculative_tokens=3)
    outputs, _, proposed, accepted = run(engine, prompts, greedy)
    assert outputs == plain
    assert proposed > 0 and accepted <= proposed


def test_seeded_sampling_with_speculation_follows_the_models_distribution(tmp_path: Path) -> None:
    """A random model over 8 tokens, prompts that repeat so prompt lookup guesses: the second
    and third generated tokens' distributions over 1,200 seeded requests are the same with
    and without speculation (chi-square, two samples), though the drafts changed the draws."""
    save_random_llama(tmp_path, seed=6, vocab_size=8, bos_token_id=0, eos_token_id=0)
    model = llmengine.load_model(tmp_path)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    trials = 1200
    params = [
        SamplingParams(max_tokens=4, temperature=1.0, seed=seed, ignore_eos=True)
        for seed in range(trials)
    ]
    outputs = {}
    for speculative in (None, "ngram"):
        engine = Engine(model, num_blocks=2048, block_size=4, num_slots=64,
                        speculative=speculative, num_speculative_tokens=2)  # fmt: skip
        outputs[speculative], _, proposed, _ = run(engine, [prompt] * trials, params)
    assert proposed > trials  # most requests' later tokens went through verification
    assert outputs[None] != outputs["ngram"]
    for position in (1, 2):
        plain, speculated = (
            torch.bincount(torch.tensor([out[position] for out in outputs[key]]), minlength=8)
            for key in (None, "ngram")
        )
        pooled = (plain + speculated).float() / (2 * trials)
        statistic = chi_square(plain.float(), trials * pooled) + chi_square(
            speculated.float(), trials * pooled
        )
        assert statistic < CHI2_CRITICAL[7], position


def test_only_rows_that_may_speculate_get_drafts(model, prompts) -> None:
    engine = Engine(model, num_blocks=128, speculative="ngram", num_speculative_tokens=3)
    plain = SamplingParams(max_tokens=40)
    penalised = SamplingParams(max_tokens=40, repetition_penalty=1.2)
    ids = engine.add_requests(prompts[:2], [plain, penalised])
    drafted: set[int] = set()
    while engine.has_unfinished():
        drafted |= set(engine.step().drafts)
    assert drafted == {ids[0]}


def test_an_abort_mid_speculation_gives_everything_back(model, prompts) -> None:
    engine = Engine(model, num_blocks=64, speculative="ngram", num_speculative_tokens=4)
    request_id = engine.add_request(prompts[0], SamplingParams(max_tokens=200))
    drafted = False
    while not drafted:
        drafted = bool(engine.step().drafts)
    engine.abort(request_id)
    engine.check_integrity()
    assert engine.num_free_blocks == 64


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"speculative": "eagle"}, "neither 'ngram' nor a draft model's checkpoint folder"),
        ({"speculative": ""}, "speculative must be"),
        ({"speculative": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ],
)
def test_bad_speculative_settings_are_refused(model, options, message) -> None:
    with pytest.raises(ValueError, match=message):
        Engine(model, num_blocks=8, **options)


# -- a draft model -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def self_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llmengine.speculative.draft import save_self_draft

    folder = tmp_path_factory.mktemp("self-draft")
    return save_self_draft(llmengine.embedded_model_path(), folder, num_layers=2)


def test_a_self_draft_is_the_first_layers_of_its_model(model, self_draft: Path) -> None:
    draft = llmengine.load_model(self_draft, kernels="eager")
    assert draft.config.num_hidden_layers == 2
    assert draft.config.vocab_size == model.config.vocab_size
    ours, theirs = model.state_dict(), draft.state_dict()
    assert set(theirs) < set(ours)
    assert all(torch.equal(ours[name], tensor) for name, tensor in theirs.items())
    assert (self_draft / "tokenizer.json").is_file()
    from llmengine.speculative.draft import save_self_draft

    with pytest.raises(ValueError, match="between 1 and 3 layers"):
        save_self_draft(llmengine.embedded_model_path(), self_draft / "x", num_layers=4)


@pytest.mark.parametrize(
    "options",
    [
        {"num_blocks": 256},
        {"num_blocks": 30, "preemption": "recompute"},
        {"num_blocks": 30, "preemption": "swap", "swap_blocks": 64},
        {"num_blocks": 256, "enable_prefix_caching": True, "max_num_batched_tokens": 12},
    ],
    ids=["roomy", "recompute", "swap", "caching-chunked"],
)
def test_a_draft_model_keeps_the_greedy_text_through_everything(
    model, prompts, self_draft: Path, options
) -> None:
    greedy = SamplingParams(max_tokens=60)
    batch = prompts + prompts
    plain, *_ = run(Engine(model, num_blocks=256, block_size=4, num_slots=10), batch, greedy)
    _, plain_forwards, *_ = run(Engine(model, block_size=4, num_slots=10, **options), batch, greedy)
    engine = Engine(model, block_size=4, num_slots=10, speculative=str(self_draft),
                    num_speculative_tokens=3, **options)  # fmt: skip
    evicted = []
    ids = engine.add_requests(batch, greedy)
    forwards = accepted = 0
    while engine.has_unfinished():
        outcome = engine.step()
        engine.check_integrity()
        evicted += outcome.evicted
        forwards += 1
        accepted += outcome.num_accepted_tokens
    assert [engine.release(i).output_token_ids for i in ids] == plain
    assert bool(evicted) == ("preemption" in options)
    assert accepted > 0
    if set(options) == {"num_blocks"}:  # with room and no budget, guessing saves forwards
        assert forwards < plain_forwards


def test_sampling_with_a_draft_model_follows_the_models_distribution(tmp_path: Path) -> None:
    """A random 2-layer model over 8 tokens and its own first layer as the draft: the
    second and third tokens' distributions match those without speculation."""
    from llmengine.speculative.draft import save_self_draft

    save_random_llama(tmp_path / "target", seed=7, vocab_size=8, num_hidden_layers=2,
                      bos_token_id=0, eos_token_id=0)  # fmt: skip
    draft = save_self_draft(tmp_path / "target", tmp_path / "draft", num_layers=1)
    model = llmengine.load_model(tmp_path / "target")
    trials = 1200
    params = [
        SamplingParams(max_tokens=4, temperature=1.0, seed=seed, ignore_eos=True)
        for seed in range(trials)
    ]
    outputs = {}
    for speculative in (None, str(draft)):
        engine = Engine(model, num_blocks=2048, block_size=4, num_slots=64,
                        speculative=speculative, num_speculative_tokens=2)  # fmt: skip
        outputs[speculative], _, proposed, accepted = run(engine, [[1, 2, 3]] * trials, params)
    assert proposed > trials and 0 < accepted < proposed
    for position in (1, 2):
        plain, speculated = (
            torch.bincount(torch.tensor([out[position] for out in outputs[key]]), minlength=8)
            for key in (None, str(draft))
        )
        pooled = (plain + speculated).float() / (2 * trials)
        statistic = chi_square(plain.float(), trials * pooled) + chi_square(
            speculated.float(), trials * pooled
        )
        assert statistic < CHI2_CRITICAL[7], position


def test_a_draft_with_another_vocabulary_is_refused(model, tmp_path: Path) -> None:
    save_random_llama(tmp_path, seed=8, vocab_size=97)
    with pytest.raises(ValueError, match="vocabulary"):
        Engine(model, num_blocks=16, speculative=str(tmp_path))
    with pytest.raises(ValueError, match="nowhere' is neither"):
        Engine(model, num_blocks=16, speculative=str(tmp_path / "nowhere"))


# -- the front doors -----------------------------------------------------------------------


def test_generate_prints_the_same_text_with_either_proposer(
    self_draft: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from llmengine.cli import main

    argv = ["generate", "--prompt", "ROMEO:", "--max-tokens", "48", "--kernels", "eager"]
    assert main(argv) == 0
    expected = capsys.readouterr().out
    for proposer in ("ngram", str(self_draft)):
        assert main([*argv, "--speculative", proposer, "--num-speculative-tokens", "3"]) == 0
        assert capsys.readouterr().out == expected


def test_the_server_streams_the_same_text_and_counts_drafts(model, tokenizer) -> None:
    import httpx
    from server_helpers import MODEL_NAME, served, sse_payloads

    body = {"model": MODEL_NAME, "prompt": "ROMEO:\n", "max_tokens": 60, "temperature": 0}
    texts = []
    for options in ({}, {"speculative": "ngram", "num_speculative_tokens": 4}):
        with served(Engine(model, num_blocks=64, **options), tokenizer) as server:
            whole = server.post("/v1/completions", body).json()["choices"][0]["text"]
            url = f"{server.url}/v1/completions"
            with httpx.stream("POST", url, json={**body, "stream": True}, timeout=30) as sse:
                chunks = [p["choices"][0]["text"] for p in sse_payloads(sse.iter_lines())]
            metrics = server.metrics()
        assert "".join(chunks) == whole
        texts.append(whole)
        drafted = metrics["llmengine_spec_decode_draft_tokens_total"]
        accepted = metrics["llmengine_spec_decode_accepted_tokens_total"]
        assert metrics["llmengine_generation_tokens_total"] == 2 * 60
        assert (drafted > 0 and 0 < accepted <= drafted) if options else drafted == 0
        # No decode graphs here: every step ran eager, and /metrics counts them so.
        steps = {k: v for k, v in metrics.items() if k.startswith("llmengine_forward_steps_total")}
        assert list(steps) == ['llmengine_forward_steps_total{forward="eager"}']
        assert steps['llmengine_forward_steps_total{forward="eager"}'] >= 60 / 5
    assert texts[0] == texts[1]

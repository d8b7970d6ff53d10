"""Lesson 28: the committed reports say what the lesson claims (greedy text unchanged at every
k and with every proposer, fewer forwards, later positions of a guess kept less often), and
its helpers count, replay, time, draw and test what the lesson says they do: step times and
the proposer's share of them, a draft model's forwards and its K/V in the target's blocks,
the draft rule's output distribution and the chi-square that tells it from a wrong rule's."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from matplotlib.figure import Figure
from report_tables import report_rows

import llmengine
from llmengine import Engine, SamplingParams
from llmengine.lessons.draft_model import (
    chi_square,
    draft_outcomes,
    fit_verdict,
    kept_share,
    refused_from_p,
    sampled_outcomes,
    shared_blocks,
)
from llmengine.lessons.exercises import embedded_model
from llmengine.lessons.speculation import (
    PROMPTS,
    Position,
    acceptance_by_position,
    engine_for,
    generate_counted,
    guess_lengths,
    matched_suffix,
    plot_acceptance,
    plot_speedups,
    replay_guesses,
)
from llmengine.lessons.speculation_cost import (
    SpeculationCost,
    StepTimes,
    faster_or_slower,
    speculation_cost,
    speed_rows,
    time_runs,
    time_steps,
)
from llmengine.speculative.draft import save_self_draft

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = llmengine.load_tokenizer()
PROMPT_IDS = [TOKENIZER.encode(prompt) for prompt in PROMPTS[:3]]
TOKENS = 40


def test_the_forwards_table_keeps_the_text_and_saves_forwards() -> None:
    rows = report_rows("speculation-forwards")
    assert [row[0] for row in rows] == ["none", "1", "3", "5"]
    assert all(row[-1] == "8/8" for row in rows)
    per_stream = [float(row[2]) for row in rows]
    assert per_stream[0] == 100.0 and per_stream == sorted(per_stream, reverse=True)


def test_the_position_table_only_falls_along_a_guess() -> None:
    rows = report_rows("speculation-acceptance-by-position")
    for k in ("1", "3", "5"):
        kept = [int(row[3]) for row in rows if row[0] == k]
        assert len(kept) == int(k) and kept == sorted(kept, reverse=True)


def test_acceptance_by_position_and_lengths() -> None:
    pairs = [(3, 0), (3, 3), (2, 1), (1, 1), (3, 2)]
    positions = acceptance_by_position(pairs, 3)
    assert positions == [Position(0, 5, 4), Position(1, 4, 2), Position(2, 3, 1)]
    assert positions[0].rate == 4 / 5
    assert math.isnan(acceptance_by_position([], 2)[1].rate)
    assert guess_lengths(pairs, 3) == [1, 1, 3]


def brute_suffix(tokens: list[int]) -> int:
    for n in (4, 3, 2, 1):
        if n < len(tokens) and any(
            tokens[s : s + n] == tokens[-n:] for s in range(len(tokens) - n)
        ):
            return n
    return 0


def test_matched_suffix_is_the_longest_that_recurs() -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        tokens = torch.randint(0, 4, (int(torch.randint(1, 12, (1,), generator=generator)),),
                               generator=generator).tolist()  # fmt: skip
        assert matched_suffix(tokens, 3) == brute_suffix(tokens)


@pytest.mark.parametrize("k", [1, 3])
def test_counted_runs_match_the_plain_engine_and_the_replay(k: int) -> None:
    model = embedded_model("eager")
    params = SamplingParams(max_tokens=TOKENS, ignore_eos=True)
    plain = Engine(model, num_blocks=64, num_slots=4).generate(PROMPT_IDS, params)
    run = generate_counted(model, PROMPT_IDS, TOKENS, k)
    assert run.outputs == plain and run.tokens == TOKENS * len(PROMPT_IDS)
    replays = [replay_guesses(p, o, k) for p, o in zip(PROMPT_IDS, plain, strict=True)]
    assert run.streams == [1 + len(replay) for replay in replays]
    assert run.forwards == max(run.streams)
    assert run.accepted == sum(g.kept for replay in replays for g in replay)
    assert run.proposed == sum(len(g.guess) for replay in replays for g in replay)
    assert all(0 <= accepted <= proposed <= k for proposed, accepted in run.drafts)
    # every forward computes the prompts once, then one position per decode plus its drafts
    decodes = sum(len(replay) for replay in replays)
    assert run.positions == sum(map(len, PROMPT_IDS)) + decodes + run.proposed
    assert 0 <= run.acceptance <= 1


def test_sampled_outcomes_follow_p() -> None:
    logits = torch.tensor([1.0, 0.0, -1.0])
    p = torch.softmax(logits, dim=-1).tolist()
    params = SamplingParams(temperature=1.0)
    trials = 4000
    kept, first = sampled_outcomes(logits, 1, params, trials, seed=3)
    assert sum(first.values()) == trials
    assert abs(kept / trials - p[1]) < 4 * math.sqrt(p[1] * (1 - p[1]) / trials)
    for token, probability in enumerate(p):
        error = 4 * math.sqrt(probability * (1 - probability) / trials)
        assert abs(first[token] / trials - probability) < error
    never, _ = sampled_outcomes(logits, 2, SamplingParams(temperature=1.0, top_k=2), 200)
    assert never == 0  # top_k leaves the draft out of p


def test_the_chi_square_tells_prompt_lookups_rule_from_a_wrong_one() -> None:
    logits = torch.tensor([1.5, 1.0, 0.5, 0.0, -1.0])
    p = torch.softmax(logits, dim=-1)
    kept, first = sampled_outcomes(logits, 2, SamplingParams(temperature=1.0), 4000, seed=5)
    assert fit_verdict(chi_square(first, p)).endswith(": the counts fit it")
    picked_for_sure = torch.zeros(5)
    picked_for_sure[2] = 1.0
    left_in = refused_from_p(p, picked_for_sure)  # a refusal's token drawn with the draft in
    assert float(left_in[2]) == pytest.approx(float(p[2] + (1 - p[2]) * p[2]))
    assert fit_verdict(chi_square(first, left_in)).endswith(
        "less than 0.01: the counts do not fit it"
    )
    assert kept_share(kept, 4000, float(p[2])).as_predicted


def test_time_runs_and_speed_rows() -> None:
    model = embedded_model("eager")
    timed = time_runs(model, PROMPT_IDS, (1, 2), (None, 2), 12, rounds=2)
    assert list(timed) == [(1, None), (1, 2), (2, None), (2, 2)]
    assert all(len(runs) == 2 for runs in timed.values())
    speeds = speed_rows(timed)
    for speed in speeds:
        runs = timed[speed.batch, speed.k]
        assert speed.tokens == 12 * speed.batch and speed.forwards == runs[0].forwards
        seconds = sorted(run.seconds for run in runs)
        assert speed.tokens_per_s == pytest.approx(speed.tokens / (sum(seconds) / 2))
        if speed.k is None:
            assert speed.speedup == speed.forward_cost == 1.0
    assert len(speeds[0].row()) == 9


def test_faster_or_slower_reads_either_way() -> None:
    assert faster_or_slower(1.4) == "1.40x faster than"
    assert faster_or_slower(0.8) == "1.25x slower than"
    assert faster_or_slower(1.001) == "as fast as"


def test_the_figures_draw() -> None:
    by_k = {1: [Position(0, 4, 2)], 2: [Position(0, 4, 3), Position(1, 3, 1)]}
    assert isinstance(plot_acceptance(by_k, {"none": 1.0, 1: 1.3, 2: 1.5}, "t"), Figure)
    model = embedded_model("eager")
    speeds = speed_rows(time_runs(model, PROMPT_IDS, (1, 2), (None, 1), 4, rounds=1))
    assert isinstance(plot_speedups(speeds, "t"), Figure)


def test_speculation_cost_reads_the_step_times() -> None:
    plain = [StepTimes([0.010, 0.004, 0.004, 0.004], [False] * 4, 0.0),
             StepTimes([0.010, 0.005, 0.005, 0.005], [False] * 4, 0.0)]  # fmt: skip
    drafted = [False, False, True, False]
    guessing = [StepTimes([0.010, 0.004, 0.006, 0.004], drafted, 0.001),
                StepTimes([0.010, 0.005, 0.007, 0.004], drafted, 0.003)]  # fmt: skip
    cost = SpeculationCost(plain, guessing)
    assert cost.difference == pytest.approx(0.025 - 0.0235)  # medians of the run totals
    assert cost.spread == pytest.approx(0.003)  # the plain rounds: 0.022 to 0.025
    assert cost.drafted_forwards == 1
    assert cost.drafted_extra == pytest.approx(0.0065 - 0.004)  # medians, prefill left out
    assert cost.proposing == pytest.approx(0.002)
    assert cost.counted == pytest.approx(0.002 + 0.0025)


def test_time_steps_and_speculation_cost_on_a_run() -> None:
    model = embedded_model("eager")
    steps = time_steps(model, PROMPT_IDS[:1], 12, 3)
    run = generate_counted(model, PROMPT_IDS[:1], 12, 3)
    assert len(steps.seconds) == run.forwards and sum(steps.drafted) == len(run.drafts)
    assert 0 < steps.proposing < steps.total
    plain = time_steps(model, PROMPT_IDS[:1], 12, None)
    assert not any(plain.drafted) and plain.proposing < plain.total / 100  # a no-op proposer
    cost = speculation_cost(model, PROMPT_IDS[:1], 12, 3, rounds=2)
    assert len(cost.plain) == len(cost.guessing) == 2 and cost.spread >= 0


@pytest.fixture(scope="module")
def one_layer_draft(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("self-draft") / "one"
    return str(save_self_draft(llmengine.embedded_model_path(), folder, 1))


def test_a_draft_run_counts_its_draft_forwards(one_layer_draft: str) -> None:
    model = embedded_model("eager")
    run = generate_counted(model, PROMPT_IDS[:1], TOKENS, 3, one_layer_draft)
    assert run.outputs == generate_counted(model, PROMPT_IDS[:1], TOKENS).outputs
    # one forward over the row's new tokens at every step, one more per draft after the first
    assert run.draft_forwards == run.forwards + sum(proposed - 1 for proposed, _ in run.drafts)
    assert generate_counted(model, PROMPT_IDS[:1], TOKENS, 3).draft_forwards == 0


def test_the_draft_shares_the_targets_blocks(one_layer_draft: str) -> None:
    model = embedded_model("eager")
    engine = engine_for(model, PROMPT_IDS[:2], TOKENS, 3, one_layer_draft)
    engine.add_requests(PROMPT_IDS[:2], SamplingParams(max_tokens=TOKENS, ignore_eos=True))
    for _ in range(4):
        engine.step()
    shared = shared_blocks(engine)
    assert [s.block_ids for s in shared] == [
        list(request.block_table.block_ids) for request in engine.scheduler.running
    ]
    for s, request in zip(shared, engine.scheduler.running, strict=True):
        assert s.target_positions == len(request.token_ids) - 1 >= s.draft_positions > 0
        assert s.largest_difference < 1e-4  # the draft's one layer is the target's first
    with pytest.raises(ValueError, match="no draft model"):
        shared_blocks(engine_for(model, PROMPT_IDS[:1], TOKENS, 3))


def test_the_draft_rule_gives_p_and_the_test_tells_a_wrong_rule() -> None:
    p_logits, q_logits = torch.tensor([1.0, 0.0, -0.5, 0.5]), torch.tensor([-1.0, 1.0, 0.0, 0.5])
    params = SamplingParams(temperature=1.0)
    p, q = torch.softmax(p_logits, dim=-1), torch.softmax(q_logits, dim=-1)
    kept, first = draft_outcomes(p_logits, q_logits, params, 3000, seed=1)
    overlap = float(torch.minimum(p, q).sum())
    assert abs(kept / 3000 - overlap) < 4 * math.sqrt(overlap * (1 - overlap) / 3000)
    assert chi_square(first, p).p_value > 0.001
    wrong = refused_from_p(p, q)
    assert float(wrong.sum()) == pytest.approx(1.0)
    assert chi_square(first, wrong).p_value < 0.001


def test_the_kept_share_tells_a_rule_that_keeps_too_few() -> None:
    p_logits, q_logits = torch.tensor([1.0, 0.0, -0.5, 0.5]), torch.tensor([-1.0, 1.0, 0.0, 0.5])
    params = SamplingParams(temperature=1.0)
    p, q = torch.softmax(p_logits, dim=-1), torch.softmax(q_logits, dim=-1)
    overlap = float(torch.minimum(p, q).sum())
    right, _ = draft_outcomes(p_logits, q_logits, params, 3000, seed=2)
    assert kept_share(right, 3000, overlap).as_predicted
    assert kept_share(right, 3000, overlap).verdict().endswith("as the rule predicts")
    # prompt lookup's rule on drafts from q: still p, but it keeps sum(p q) of them, not the overlap
    wasteful, first = draft_outcomes(p_logits, q_logits, params, 3000, seed=2, told_q=False)
    assert chi_square(first, p).p_value > 0.001
    share = kept_share(wasteful, 3000, overlap)
    assert not share.as_predicted and share.errors < -3
    assert share.verdict().endswith("fewer drafts kept than predicted")
    assert kept_share(wasteful, 3000, float((p * q).sum())).as_predicted


def test_kept_share_reads_standard_errors() -> None:
    share = kept_share(530, 1000, 0.5)  # standard error sqrt(0.25 / 1000) = 0.0158
    assert share.standard_error == pytest.approx(0.015811, rel=1e-4)
    assert share.errors == pytest.approx(1.897, rel=1e-3) and share.as_predicted
    assert not kept_share(560, 1000, 0.5).as_predicted  # 3.8 standard errors above
    assert kept_share(560, 1000, 0.5).verdict().endswith("more drafts kept than predicted")
    assert kept_share(10, 10, 1.0).as_predicted and not kept_share(9, 10, 1.0).as_predicted


def test_chi_square_against_known_values() -> None:
    fair = torch.full((4,), 0.25)
    exact = chi_square(Counter({0: 25, 1: 25, 2: 25, 3: 25}), fair)
    assert exact.statistic == 0.0 and exact.degrees == 3 and exact.p_value == pytest.approx(1.0)
    skewed = chi_square(Counter({0: 40, 1: 20, 2: 20, 3: 20}), fair)
    assert skewed.statistic == pytest.approx(12.0)  # (15² + 3 · 5²) / 25
    assert skewed.p_value == pytest.approx(0.00738, rel=1e-3)  # chi2.sf(12, 3)
    # tokens expected fewer than 5 times share one bin, folded into the last when still too few
    tail = torch.tensor([0.5, 0.3, 0.04, 0.04, 0.04, 0.04, 0.04])
    shared = chi_square(Counter({0: 50, 1: 30, 2: 20}), tail)
    assert shared.degrees == 2 and shared.statistic == pytest.approx(0.0)
    folded = chi_square(Counter({0: 90, 1: 4, 2: 3, 3: 3}), torch.tensor([0.9, 0.06, 0.02, 0.02]))
    assert folded.degrees == 1 and folded.statistic == pytest.approx(0.0)


def test_the_draft_tables_keep_the_text() -> None:
    rows = report_rows("speculation-draft-model")
    assert [row[0] for row in rows][0] == "prompt lookup" and len(rows) == 3
    assert all(row[-1] == "8/8" for row in rows)
    shares = [float(row[-1]) for row in report_rows("speculation-draft-rule")]
    assert sum(shares) == pytest.approx(1.0, abs=0.01)

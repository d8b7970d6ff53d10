"""Lesson 28: the committed reports say what the lesson claims (greedy text unchanged at every
k, fewer forwards, later positions of a guess kept less often), and its helpers count, replay,
time and draw what the lesson says they do."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from matplotlib.figure import Figure

import llmengine
from llmengine import Engine, SamplingParams
from llmengine.lessons.exercises import embedded_model
from llmengine.lessons.speculation import (
    PROMPTS,
    Position,
    acceptance_by_position,
    faster_or_slower,
    generate_counted,
    guess_lengths,
    matched_suffix,
    plot_acceptance,
    plot_speedups,
    replay_guesses,
    sampled_outcomes,
    speed_rows,
    time_runs,
)

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = llmengine.load_tokenizer()
PROMPT_IDS = [TOKENIZER.encode(prompt) for prompt in PROMPTS[:3]]
TOKENS = 40


def table_rows(name: str) -> list[list[str]]:
    lines = (ROOT / "reports" / f"{name}.md").read_text(encoding="utf-8").splitlines()
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def test_the_forwards_table_keeps_the_text_and_saves_forwards() -> None:
    rows = table_rows("speculation-forwards")
    assert [row[0] for row in rows] == ["none", "1", "3", "5"]
    assert all(row[-1] == "8/8" for row in rows)
    per_stream = [float(row[2]) for row in rows]
    assert per_stream[0] == 100.0 and per_stream == sorted(per_stream, reverse=True)


def test_the_position_table_only_falls_along_a_guess() -> None:
    rows = table_rows("speculation-acceptance-by-position")
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

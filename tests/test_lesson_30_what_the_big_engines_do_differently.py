"""Lesson 30, what the big engines do differently: its tables recomputed with the package.

The feature table is rebuilt from `big_engines` against the lessons on disk, every claim is
checked to cite a known source and every source to be cited; the prefix-granularity table
runs the engine again and is checked against the two reuse rules; the K/V table is checked
against the engine's pool and the count.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmengine.lessons.artifacts import markdown_table
from llmengine.lessons.big_engines import (
    ENGINES,
    FEATURES,
    citation_order,
    feature_rows,
    lesson_number,
    reference_number,
    references,
)
from llmengine.lessons.big_engines_sources import SOURCES
from llmengine.lessons.engine_contrasts import (
    GRANULARITY_HEADERS,
    KV_HEADERS,
    LLAMA3_8B,
    block_rule,
    granularity_rows,
    kv_rows,
    shared_prefix_prompts,
    token_rule,
)
from llmengine.runner.loading import load_model

ROOT = Path(__file__).resolve().parent.parent
LESSONS, REPORTS = ROOT / "lessons", ROOT / "reports"
UNCOVERED = "not covered by the sources cited here"


def report(name: str) -> str:
    return (REPORTS / f"{name}.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def eager_model():
    return load_model(kernels="eager")


def test_the_feature_table_is_the_committed_one() -> None:
    table = markdown_table(feature_rows(LESSONS), ["feature", "llmengine", *ENGINES])
    assert table == report("big-engines-features")


def test_every_claim_cites_known_sources_and_every_source_is_cited() -> None:
    for feature in FEATURES:
        assert feature.lessons, feature.name
        for claim in feature.peers:
            assert claim.sources or claim.text == UNCOVERED, (feature.name, claim.text)
            assert set(claim.sources) <= set(SOURCES), claim.sources
    assert sorted(citation_order()) == sorted(SOURCES)


def test_references_are_numbered_in_the_order_of_first_citation() -> None:
    lines = references().splitlines()
    assert len(lines) == len(SOURCES)
    for number, key in enumerate(citation_order(), start=1):
        assert reference_number(key) == number
        assert lines[number - 1].startswith(f"{number}. {SOURCES[key].engine}: [")
        assert lines[number - 1].endswith(f"({SOURCES[key].url})")


def test_a_cited_lesson_must_exist_once(tmp_path: Path) -> None:
    for slug in {slug for feature in FEATURES for slug in feature.lessons}:
        number = lesson_number(slug, LESSONS)
        assert (LESSONS / f"{number}-{slug}.ipynb").is_file()
    with pytest.raises(FileNotFoundError, match="0 lessons"):
        lesson_number("a-lesson-nobody-wrote", LESSONS)
    for name in ("07-twice.ipynb", "08-twice.ipynb"):
        (tmp_path / name).write_text("{}")
    with pytest.raises(FileNotFoundError, match="2 lessons"):
        lesson_number("twice", tmp_path)


def test_the_prompts_share_exactly_the_prefix() -> None:
    first, second = shared_prefix_prompts(37, 13, 2048)
    assert first[:37] == second[:37] and first[37] != second[37]
    assert len(first) == len(second) == 50


def test_prefix_granularity_follows_the_rules_and_the_report(eager_model) -> None:
    rows = granularity_rows(eager_model, 37, 13, (1, 4, 8, 16, 32))
    for block_size, entries, taken, computed, lost in rows:
        assert taken == block_rule(37, 50, block_size)
        assert taken + computed == 50 and entries * block_size >= 50
        assert lost == token_rule(37, 50) - taken < block_size
    assert rows[0][2] == token_rule(37, 50)  # blocks of one token are token-granular
    assert markdown_table(rows, GRANULARITY_HEADERS, ["d"] * 5) == report(
        "big-engines-prefix-granularity"
    )


def test_kv_bytes_are_the_pools_and_the_count(eager_model) -> None:
    rows = kv_rows(eager_model.config)
    assert [row[3] for row in rows[:2]] == [4096, 2048]
    llama = {row[1]: row for row in rows[2:]}
    assert llama["bfloat16"][3] == 2 * 32 * 8 * 128 * 2 == LLAMA3_8B.bytes_per_token(2)
    assert llama["fp8"][4] == 2 * llama["bfloat16"][4]
    table = markdown_table(rows, KV_HEADERS, ["", "", ",d", ",.0f", ",d"])
    assert table == report("big-engines-kv-bytes")

"""`llmengine bench`: the contract's JSON fields, the table and CSV views, clear errors."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from hf_llama import save_random_llama

from llmengine.cli import main

DAY33 = ["--requests", "4", "--prompt-len", "5", "--max-tokens", "24", "--slots", "4"]
SMALL = ["--requests", "2", "--prompt-len", "3", "--max-tokens", "5", "--slots", "2"]
CONTRACT_FIELDS = {
    "pool_blocks",
    "iterations",
    "occupancy",
    "preemptions",
    "evictions_per_request",
    "forward_tokens",
    "recomputed_tokens",
    "recompute_fraction",
    "preemption_latency_penalty",
    "latencies_iterations",
    "same_text",
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bench-llama")
    save_random_llama(folder, seed=7)
    return folder


def bench(checkpoint: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = main(["bench", "--model", str(checkpoint), *args])
    return status, capsys.readouterr().out


def test_json_has_the_contract_fields_and_the_day33_numbers(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out = bench(
        checkpoint, capsys, *DAY33, "--block-size", "4", "--pools", "12,24,32", "--format", "json"
    )
    assert status == 0
    pools = json.loads(out)
    assert [pool["pool_blocks"] for pool in pools] == [12, 24, 32]
    assert all(pool.keys() >= CONTRACT_FIELDS for pool in pools)
    assert [pool["iterations"] for pool in pools] == [44, 28, 24]
    assert [pool["preemptions"] for pool in pools] == [3, 1, 0]
    assert [pool["recomputed_tokens"] for pool in pools] == [55, 25, 0]
    assert pools[2]["latencies_iterations"] == [24, 24, 24, 24]
    assert pools[2]["preemption_latency_penalty"] == 1.0
    assert all(pool["same_text"] is True for pool in pools)


def test_policy_reaches_the_engine(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = [*SMALL, "--block-size", "4", "--pools", "2,4", "--format", "json"]
    _, reserve = bench(checkpoint, capsys, *common, "--policy", "reserve")
    _, incremental = bench(checkpoint, capsys, *common)
    # Each request's worst case is 8 tokens, two blocks: reserve runs them one at a time in 2.
    assert [pool["iterations"] for pool in json.loads(reserve)] == [10, 5]
    assert json.loads(incremental)[0]["preemptions"] > 0


def test_preemption_and_swap_blocks_reach_the_engine(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = [*DAY33, "--block-size", "4", "--pools", "12,24,32", "--format", "json"]
    _, recompute = bench(checkpoint, capsys, *common)
    status, swap = bench(checkpoint, capsys, *common, "--preemption", "swap", "--swap-blocks", "64")
    assert status == 0
    recompute_pools, swap_pools = json.loads(recompute), json.loads(swap)
    assert [pool["swap_blocks"] for pool in swap_pools] == [64, 64, 64]
    assert [pool["recomputed_tokens"] for pool in swap_pools] == [0, 0, 0]
    assert [pool["swapped_out"] for pool in swap_pools] == [p["preemptions"] for p in swap_pools]
    assert swap_pools[0]["swapped_out"] > 0 and swap_pools[0]["bytes_swapped"] > 0
    assert [pool["swapped_out"] for pool in recompute_pools] == [0, 0, 0]
    assert swap_pools[0]["forward_tokens"] < recompute_pools[0]["forward_tokens"]
    assert all(pool["same_text"] is True for pool in swap_pools)


def test_the_table_under_swap_names_it_and_shows_the_swap_columns(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = [*SMALL, "--block-size", "4", "--pools", "4,2"]
    status, table = bench(checkpoint, capsys, *common, "--preemption", "swap", "--swap-blocks", "8")
    assert status == 0
    title, header, *rows, footer = table.splitlines()
    assert "swap (8 host blocks)" in title
    assert "swapped" in header.split() and header.endswith("MiB moved")
    assert len({len(line) for line in (header, *rows)}) == 1
    assert footer == "same text in every pool: yes"


def test_swap_blocks_without_swap_is_an_error_not_a_traceback(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = [*SMALL, "--block-size", "4", "--pools", "8", "--swap-blocks", "4"]
    status = main(["bench", "--model", str(checkpoint), *options])
    assert status == 2
    assert "needs preemption='swap'" in capsys.readouterr().err


def test_table_and_csv(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = [*SMALL, "--block-size", "4", "--pools", "4,2"]
    status, table = bench(checkpoint, capsys, *common)
    assert status == 0
    header, *rows, footer = table.splitlines()
    assert header.startswith("2 requests arriving together")
    assert len({len(row) for row in rows}) == 1 and len(rows) == 3
    assert rows[1].split()[0] == "4" and rows[2].split()[0] == "2"
    assert footer == "same text in every pool: yes"
    _, text = bench(checkpoint, capsys, *common, "--format", "csv")
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert [row["pool_blocks"] for row in parsed] == ["4", "2"]
    assert parsed[0].keys() >= CONTRACT_FIELDS


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (("--pools", "48,x"), "--pools: expected a whole number, got 'x'"),
        (("--pools", "48,0"), "--pools: must be at least 1, got 0"),
        (("--requests", "-1"), "--requests: must be at least 1"),
        (("--policy", "greedy"), "invalid choice: 'greedy'"),
        (("--format", "yaml"), "invalid choice: 'yaml'"),
        (("--preemption", "lru"), "invalid choice: 'lru'"),
        (("--swap-blocks", "-1"), "--swap-blocks: must be at least 0, got -1"),
        (("--swap-blocks", "many"), "--swap-blocks: expected a whole number, got 'many'"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(
    override: tuple[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    options = dict(zip(SMALL[::2], SMALL[1::2], strict=True))
    options.update({"--block-size": "4", "--pools": "8"})
    options.update([override])
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *(part for pair in options.items() for part in pair)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_arguments_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--requests", "2"])
    assert exit_info.value.code == 2
    assert "--prompt-len" in capsys.readouterr().err


def test_a_pool_too_small_is_an_error_not_a_traceback(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        ["bench", "--model", str(checkpoint), *SMALL, "--block-size", "4", "--pools", "8,1"]
    )
    assert status == 2
    assert "pool of 1 blocks" in capsys.readouterr().err

"""The command line: `generate` output, and clear errors without tracebacks."""

import subprocess
import sys
from pathlib import Path

import pytest
from hf_llama import save_random_llama

import llmengine
from llmengine.cli import build_parser, main
from llmengine.generation import generate_text
from llmengine.sampling import SamplingParams

WORDS = ["<unk>", "<s>", "</s>", *(f"w{index}" for index in range(29))]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a word-level tokenizer, saved like a Hugging Face checkpoint."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-llama")
    save_random_llama(folder, vocab_size=len(WORDS), bos_token_id=1, eos_token_id=2)
    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(WORDS)}, "<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(folder)
    return folder


def test_generate_prints_the_completion(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "--model", str(checkpoint), "--prompt", "w3 w4", "--max-tokens", "5"]
    assert main(argv) == 0
    model, tokenizer = llmengine.load_model(checkpoint), llmengine.load_tokenizer(checkpoint)
    expected = generate_text(model, tokenizer, "w3 w4", SamplingParams(max_tokens=5))
    assert capsys.readouterr().out == expected + "\n"


def test_sampling_flags_reach_the_sampler(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--temperature", "1.5", "--top-k", "8", "--top-p", "0.9", "--seed", "4"]
    argv = ["generate", "--model", str(checkpoint), "--prompt", "w1", "--max-tokens", "6", *flags]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == first
    model, tokenizer = llmengine.load_model(checkpoint), llmengine.load_tokenizer(checkpoint)
    params = SamplingParams(max_tokens=6, temperature=1.5, top_k=8, top_p=0.9, seed=4)
    assert first == generate_text(model, tokenizer, "w1", params) + "\n"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--max-tokens", "0"], "max_tokens must be an integer >= 1"),
        (["--top-p", "2"], "top_p must be in (0, 1]"),
    ],
)
def test_bad_sampling_values_are_one_line_errors(
    checkpoint: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    assert main(["generate", "--model", str(checkpoint), "--prompt", "w1", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmengine generate: error:") and message in err


def test_a_folder_that_is_not_a_checkpoint_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", "--model", str(tmp_path / "missing"), "--prompt", "x"]) == 2
    assert "missing" in capsys.readouterr().err
    assert main(["generate", "--model", str(tmp_path), "--prompt", "x"]) == 2
    assert "config.json" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv", [[], ["generate"], ["generate", "--prompt", "x", "--max-tokens", "many"], ["fly"]]
)
def test_usage_errors_exit_with_status_two(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2


def test_every_subcommand_is_listed_in_help() -> None:
    assert "generate" in build_parser().format_help()


def test_python_dash_m_runs_the_command_line(checkpoint: Path) -> None:
    command = [sys.executable, "-m", "llmengine", "generate", "--model", str(checkpoint)]
    ok = subprocess.run([*command, "--prompt", "w5", "--max-tokens", "3"], capture_output=True)
    assert ok.returncode == 0 and ok.stdout.strip()
    bad = subprocess.run([*command, "--prompt", "w5", "--seed", "-3"], capture_output=True)
    assert bad.returncode == 2
    assert b"seed must be" in bad.stderr and b"Traceback" not in bad.stderr


def test_generate_uses_the_embedded_model_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--prompt", "ROMEO:", "--max-tokens", "8"]) == 0
    assert capsys.readouterr().out.strip()

"""The command line: `generate` streams the engine's completion, and errors are one clear line."""

import io
import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_llama import save_random_llama, save_word_level_tokenizer
from tokenizers import decoders, pre_tokenizers

import llmengine
from llmengine.cli import EXIT_BROKEN_PIPE, build_parser, main
from llmengine.generation import generate_text, generate_tokens
from llmengine.model.detokenizer import REPLACEMENT_CHARACTER
from llmengine.sampling import SamplingParams

WORDS = ["<unk>", "<s>", "</s>", *(f"w{index}" for index in range(29))]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a word-level tokenizer, saved like a Hugging Face checkpoint."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    save_random_llama(folder, vocab_size=len(WORDS), bos_token_id=1, eos_token_id=2)
    save_word_level_tokenizer(folder, WORDS)
    return folder


SUMMARY = re.compile(r"llmengine generate: (\d+) tokens in \d+\.\d\d s \(\d+ tokens/s\)\n")


def test_generate_prints_the_completion(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "--model", str(checkpoint), "--prompt", "w3 w4", "--max-tokens", "5"]
    assert main(argv) == 0
    model, tokenizer = llmengine.load_model(checkpoint), llmengine.load_tokenizer(checkpoint)
    params = SamplingParams(max_tokens=5)
    expected = generate_text(model, tokenizer, "w3 w4", params)
    captured = capsys.readouterr()
    assert captured.out == expected + "\n"
    summary = SUMMARY.fullmatch(captured.err)
    assert summary is not None, captured.err
    tokens = generate_tokens(model, tokenizer.encode("w3 w4"), params)
    assert int(summary.group(1)) == len(tokens)


class RecordingStdout(io.StringIO):
    """A stdout that logs each write and each flush, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str | None] = []  # a written text, or None for a flush

    def write(self, text: str) -> int:
        self.events.append(text)
        return super().write(text)

    def flush(self) -> None:
        self.events.append(None)


def test_generate_streams_the_text_as_it_is_generated(monkeypatch: pytest.MonkeyPatch) -> None:
    stdout = RecordingStdout()
    monkeypatch.setattr(sys, "stdout", stdout)
    argv = ["generate", "--prompt", "ROMEO:", "--max-tokens", "24", "--ignore-eos"]
    assert main(argv) == 0
    model, tokenizer = llmengine.load_model(), llmengine.load_tokenizer()
    engine = llmengine.Engine(model, num_blocks=4, tokenizer=tokenizer)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    assert stdout.getvalue() == engine.generate_text(["ROMEO:"], params)[0] + "\n"
    writes = [event for event in stdout.events if event is not None]
    assert len(writes) > 10, "the text came in a few large writes, not as it was generated"
    assert all(after is None for before, after in itertools.pairwise(stdout.events) if before)


def test_generate_never_prints_half_a_character(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A random model over byte pieces (é and 😀 in two tokens each, the first alone not a
    character) makes up characters out of several tokens: the printed text is still exactly
    the completion decoded at once."""
    bytes_as_text = pre_tokenizers.ByteLevel(
        add_prefix_space=False, use_regex=False
    ).pre_tokenize_str("é😀")[0][0]
    pieces = [bytes_as_text[0], bytes_as_text[1], bytes_as_text[2:5], bytes_as_text[5]]
    words = [*WORDS[:3], "a", *pieces]
    save_random_llama(tmp_path, vocab_size=len(words), bos_token_id=1, eos_token_id=2)
    save_word_level_tokenizer(tmp_path, words, decoders.ByteLevel())
    argv = ["generate", "--model", str(tmp_path), "--prompt", "a", "--max-tokens", "40"]
    assert main([*argv, "--ignore-eos"]) == 0
    model, tokenizer = llmengine.load_model(tmp_path), llmengine.load_tokenizer(tmp_path)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    expected = generate_text(model, tokenizer, "a", params)
    whole = [char for char in expected if not char.isascii() and char != REPLACEMENT_CHARACTER]
    assert whole, "no character of this completion spans tokens: the test tests nothing"
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


def test_dtype_reaches_the_model(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--model", str(checkpoint), "--prompt", "w3", "--max-tokens", "5"]
    assert main([*argv, "--dtype", "bfloat16"]) == 0
    model = llmengine.load_model(checkpoint, dtype="bfloat16")
    expected = generate_text(
        model, llmengine.load_tokenizer(checkpoint), "w3", SamplingParams(max_tokens=5)
    )
    assert capsys.readouterr().out == expected + "\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
@pytest.mark.parametrize("command", [["generate", "--prompt", "w1"], ["serve"]])
def test_a_missing_gpu_is_a_one_line_error(
    checkpoint: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    assert main([*command, "--model", str(checkpoint), "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    message = "device 'cuda' asked for, but torch sees no CUDA device"
    assert err == f"llmengine {command[0]}: error: {message}\n"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--temperature", "-1"], "temperature must be 0 (greedy) or at least"),
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


def test_generate_starts_without_transformers_or_dynamo() -> None:
    """`python -m llmengine generate` on the embedded model, with its imports logged: neither
    transformers (the tokenizer is read by `tokenizers`) nor torch._dynamo (which building
    the model on the meta device used to pull in) is imported, about 4 s of start-up."""
    command = [sys.executable, "-X", "importtime", "-m", "llmengine", "generate"]
    run = subprocess.run([*command, "--prompt", "ROMEO:", "--max-tokens", "3"], capture_output=True)
    assert run.returncode == 0 and run.stdout.strip()
    lines = run.stderr.decode().splitlines()
    imported = {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")}
    assert "llmengine.model.tokenizer" in imported and "torch" in imported
    heavy = sorted(name for name in imported if name.startswith(("transformers", "torch._dynamo")))
    assert heavy == []
    assert SUMMARY.fullmatch(lines[-1] + "\n")


def test_errors_from_the_console_have_no_traceback(checkpoint: Path) -> None:
    command = [sys.executable, "-m", "llmengine", "generate", "--model", str(checkpoint)]
    bad = subprocess.run([*command, "--prompt", "w5", "--seed", "-3"], capture_output=True)
    assert bad.returncode == 2
    assert b"seed must be" in bad.stderr and b"Traceback" not in bad.stderr


class ClosedPipe(io.StringIO):
    """The stdout of `llmengine generate ... | head -c 10` once head has exited."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_stdout_stops_generate_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["generate", "--prompt", "ROMEO:", "--max-tokens", "8"]) == EXIT_BROKEN_PIPE
    assert capsys.readouterr().err == ""


def test_generate_uses_the_embedded_model_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--prompt", "ROMEO:", "--max-tokens", "8"]) == 0
    assert capsys.readouterr().out.strip()

"""llama.cpp as a peer: built from the source inside PyPI's llama-cpp-python sdist, run as
`llama-batched-bench` (offline decode) and `llama-server` (HTTP).

PyPI is the only registry this project reaches, and the `llama-cpp-python` sdist vendors a
whole llama.cpp checkout (`vendor/llama.cpp`, with `convert_hf_to_gguf.py` and `gguf-py`), so
that is where llama.cpp comes from. The build is `-DGGML_NATIVE=ON` (this CPU's ISA) without
libcurl, for the two targets only, under `nice -n 19`; the converter runs in a virtual
environment of its own (torch, transformers, the sdist's gguf-py), never llmengine's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from llmengine.bench.peers.plan import CONTEXT_PER_SEQUENCE

SDIST = "llama-cpp-python"
TARGETS = ("llama-batched-bench", "llama-server")
BUILD_TIMEOUT_S = 3 * 3600
CONVERT_REQUIREMENTS = (
    "torch==2.13.0",  # the +cpu build from this machine's index, as the project's own venv
    "numpy~=2.2.6",
    "sentencepiece>=0.1.98,<0.3.0",
    "transformers==4.57.6",
    "protobuf>=4.21.0,<5.0.0",
    "safetensors",
)


@dataclass(frozen=True, slots=True)
class LlamaCpp:
    """A prepared llama.cpp: its source, its binaries, the converter's Python, its version."""

    source: Path
    bin_dir: Path
    convert_python: Path
    version: str

    def binary(self, name: str) -> Path:
        """The built binary `name`; RuntimeError when it is not (yet) there (`--no-build`)."""
        path = self.bin_dir / name
        if not path.exists():
            raise RuntimeError(f"{name} is not built in {self.bin_dir}")
        return path


def run_logged(command: Sequence[str | Path], log: Path, timeout: float, **kwargs) -> None:
    """Run `command`, its output into `log`; RuntimeError with the log's tail if it fails."""
    print(f"  $ {' '.join(map(str, command))}  (log: {log})", flush=True)
    with log.open("w") as out:
        try:
            done = subprocess.run(
                list(map(str, command)),
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                **kwargs,
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{Path(command[0]).name} took over {timeout:g} s") from None
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-800:]
        raise RuntimeError(f"{Path(command[0]).name} exited {done.returncode}: {tail}")


def _sdist(cache: Path) -> Path:
    found = sorted((cache / "sdist").glob("llama_cpp_python-*.tar.gz"))
    if not found:
        print("downloading the llama-cpp-python sdist (llama.cpp's source) from PyPI", flush=True)
        (cache / "sdist").mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        run_logged([*pip, SDIST, "-d", cache / "sdist"], cache / "pip-download.log", 900)
        found = sorted((cache / "sdist").glob("llama_cpp_python-*.tar.gz"))
    return found[-1]


def _source(cache: Path, sdist: Path) -> Path:
    folder = cache / sdist.name.removesuffix(".tar.gz")
    source = folder / "vendor" / "llama.cpp"
    if not (source / "CMakeLists.txt").exists():
        print(f"extracting {sdist.name}", flush=True)
        with tarfile.open(sdist) as archive:
            archive.extractall(cache, filter="data")
    return source


def _build(cache: Path, source: Path) -> Path:
    build = cache / "llama-build"
    bin_dir = build / "bin"
    if all((bin_dir / target).exists() for target in TARGETS):
        return bin_dir
    print("building llama.cpp (about 15 min on 2 cores, nice -n 19)", flush=True)
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = ["nice", "-n", "19", "cmake", "-S", source, "-B", build, *generator]
    configure += ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF"]
    configure += [
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DBUILD_SHARED_LIBS=OFF",
    ]
    run_logged(configure, cache / "cmake-configure.log", 600)
    jobs = str(os.cpu_count() or 1)
    compile_ = ["nice", "-n", "19", "cmake", "--build", build, "-j", jobs, "--target", *TARGETS]
    run_logged(compile_, cache / "cmake-build.log", BUILD_TIMEOUT_S)
    return bin_dir


def _convert_python(cache: Path, source: Path) -> Path:
    venv = cache / "convert-venv"
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if not stamp.exists():
        print("installing the GGUF converter's packages into .cache/peers/convert-venv", flush=True)
        run_logged([sys.executable, "-m", "venv", venv], cache / "convert-venv.log", 300)
        pip = [python, "-m", "pip", "install", *CONVERT_REQUIREMENTS, source / "gguf-py"]
        run_logged(pip, cache / "convert-install.log", 1800)
        stamp.touch()
    return python


def _version(bin_dir: Path, sdist: Path) -> str:
    """The sdist's version and what a binary says of itself (no git: commit unknown)."""
    built = [bin_dir / target for target in TARGETS if (bin_dir / target).exists()]
    if not built:
        raise RuntimeError(f"none of {', '.join(TARGETS)} is built in {bin_dir}")
    try:
        done = subprocess.run(
            [str(built[0]), "--version"], capture_output=True, text=True, timeout=30
        )
        said = next(
            (line for line in (done.stdout + done.stderr).splitlines() if "version" in line), ""
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        said = f"--version failed: {error}"
    return f"vendored in {sdist.name.removesuffix('.tar.gz')} ({said.strip()})"


def prepare(cache: Path, build: bool = True) -> LlamaCpp:
    """Download, extract, build and install the converter, reusing whatever `cache` holds.

    With `build=False` the binaries already built are used as they are (a build may still be
    going on beside the run), and a missing one fails only the rows that need it.
    """
    cache.mkdir(parents=True, exist_ok=True)
    sdist = _sdist(cache)
    source = _source(cache, sdist)
    bin_dir = _build(cache, source) if build else cache / "llama-build" / "bin"
    python = _convert_python(cache, source)
    return LlamaCpp(source, bin_dir, python, _version(bin_dir, sdist))


def convert(llama: LlamaCpp, checkpoint: Path, out: Path) -> Path:
    """`checkpoint` (Hugging Face Llama folder) as an f32 GGUF at `out`, unless already there."""
    if out.exists():
        return out
    print(f"converting {checkpoint} to f32 GGUF", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    script = Path(__file__).with_name("convert_gguf.py")
    partial = out.with_suffix(".partial")
    command = [llama.convert_python, script, llama.source, checkpoint]
    command += ["--outtype", "f32", "--outfile", partial]
    run_logged(command, out.with_suffix(".log"), 1800)
    partial.rename(out)
    return out


def parse_batched_bench(text: str, seconds: str = "t") -> dict[int, float]:
    """Generated tokens per second by number of sequences, from `--output-format jsonl`.

    Each JSON line has `pl` sequences of `pp` prompt tokens and `tg` generated tokens, `t`
    seconds for the whole (prompt and generation) and `t_tg` for the generation alone. With
    `seconds="t"`, tok/s is `pl * tg / t`, what the other engines report for a call that
    serves the same requests; with `seconds="t_tg"` it is the decode steps' speed alone.
    """
    speeds = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and {"pl", "tg", seconds} <= row.keys() and row[seconds] > 0:
            speeds[int(row["pl"])] = row["pl"] * row["tg"] / row[seconds]
    return speeds


def batched_bench(
    llama: LlamaCpp,
    gguf: Path,
    batches: Sequence[int],
    prompt_len: int,
    tokens: int,
    threads: int,
    timeout: float,
    seconds: str = "t",
) -> dict[int, float]:
    """One `llama-batched-bench` call over every batch size (prompts not shared); `seconds`
    as in `parse_batched_bench`."""
    command = [str(llama.binary("llama-batched-bench")), "-m", str(gguf)]
    command += ["-c", str(max(batches) * (prompt_len + tokens)), "-b", "2048", "-ub", "512"]
    command += ["-npp", str(prompt_len), "-ntg", str(tokens), "-npl", ",".join(map(str, batches))]
    command += ["-t", str(threads), "-tb", str(threads), "--output-format", "jsonl"]
    # Its results go through llama.cpp's logger, whose thread a quick exit often cuts off
    # before it writes anything to a pipe (about two calls in three on a 2-core EPYC). A log
    # file as well catches more of them: 6 calls in 6 on an idle machine, half beside a
    # process compiling a graph. Callers take the calls that printed a row.
    with tempfile.TemporaryDirectory() as directory:
        log = Path(directory) / "batched-bench.log"
        done = subprocess.run(
            [*command, "--log-file", str(log)], capture_output=True, text=True, timeout=timeout
        )
        logged = log.read_text(encoding="utf-8") if log.exists() else ""
    speeds = parse_batched_bench(done.stdout + "\n" + done.stderr + "\n" + logged, seconds)
    if done.returncode != 0 or not speeds:
        raise RuntimeError(f"llama-batched-bench exited {done.returncode}: {done.stderr[-400:]}")
    return speeds


def server_command(llama: LlamaCpp, gguf: Path, slots: int, threads: int) -> list[str]:
    """`llama-server` with `slots` parallel sequences of CONTEXT_PER_SEQUENCE positions each;
    `{port}` is filled in by `servers.running`."""
    command = [str(llama.binary("llama-server")), "-m", str(gguf), "--host", "127.0.0.1"]
    command += ["--port", "{port}", "-np", str(slots), "-c", str(slots * CONTEXT_PER_SEQUENCE)]
    return command + ["-t", str(threads), "-tb", str(threads), "--no-webui"]


def greedy_tokens(
    url: str, prompts: Sequence[Sequence[int]], tokens: int, timeout: float
) -> list[list[int]]:
    """Greedy token ids for each prompt from llama-server's own `/completion` endpoint, which
    returns the raw ids (`return_tokens`), so no detokenizing stands in between."""
    outputs = []
    for prompt in prompts:
        body = {"prompt": list(prompt), "n_predict": tokens, "temperature": 0.0, "top_k": 1}
        body |= {"ignore_eos": True, "return_tokens": True, "cache_prompt": False}
        answer = httpx.post(f"{url}/completion", json=body, timeout=timeout)
        answer.raise_for_status()
        outputs.append([int(token) for token in answer.json()["tokens"]])
    return outputs

"""llguidance, xgrammar and outlines-core on the embedded model's tokenizer: what each costs
to set up, to compile a constraint, and to compute a mask per step.

Each library follows the same token path, the greedy output of the engine under each
constraint (so every mask is one a real request asks for), and the mask of every step is
timed with `time.perf_counter`. The libraries that are not installed are reported as such:
the project depends on llguidance alone, and xgrammar needs triton (about 1 GB) on Linux,
so this comparison runs in a scratch environment holding all three:

    python3 -m venv /tmp/grammars && /tmp/grammars/bin/pip install torch==2.13.0 \
        llguidance==1.9.1 xgrammar==0.2.8 outlines-core==0.2.14 tokenizers==0.23.3 \
        transformers==5.23.0 safetensors==0.8.0
    PYTHONPATH=. /tmp/grammars/bin/python scripts/compare_grammar_libraries.py

Writes `reports/wallclock/grammar-libraries.md`.
"""

from __future__ import annotations

import importlib.metadata
import json
import statistics
import time
from collections.abc import Callable

import torch

import llmengine
from llmengine import Constraint, Engine, SamplingParams
from llmengine.bench.throughput import machine_description
from llmengine.lessons.artifacts import markdown_table, write_report

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["merry", "sad", "wroth"]},
    },
    "required": ["name", "age", "mood"],
    "additionalProperties": False,
}
REGEX = r"(Good|Ill) (morrow|night), [A-Z][a-z]{2,9}\."
ROUNDS = 5


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet read backwards: the character standing for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    codes, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes, strict=True)}


class Library:
    """One library behind the same calls: `load` imports it (not timed: an import is paid
    once per process), `setup` reads the tokenizer, `compile` returns a step's mask and the
    call that advances past a token."""

    name = ""

    def load(self) -> None: ...
    def setup(self, tokenizer_json: str, vocab: int) -> None: ...
    def compile(self, kind: str, source: str) -> tuple[Callable[[], object], Callable]: ...


class LLGuidance(Library):
    name = "llguidance"

    def load(self) -> None:
        import llguidance

        self.module = llguidance

    def setup(self, tokenizer_json: str, vocab: int) -> None:
        llguidance = self.module
        self.vocab = vocab
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab, eos_token=0)

    def compile(self, kind: str, source: str):
        matcher_class = self.module.LLMatcher
        grammar = (
            matcher_class.grammar_from_json_schema(source, defaults={"whitespace_flexible": False})
            if kind == "json"
            else matcher_class.grammar_from_regex(source)
        )
        matcher = matcher_class(self.tokenizer, grammar, log_level=0)
        mask = torch.zeros((self.vocab + 31) // 32, dtype=torch.int32)

        def step_mask() -> None:
            matcher.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)

        return step_mask, matcher.consume_token


class XGrammar(Library):
    name = "xgrammar"

    def load(self) -> None:
        import tokenizers
        import xgrammar
        from transformers import PreTrainedTokenizerFast

        self.module = xgrammar
        self.wrap = lambda text: PreTrainedTokenizerFast(
            tokenizer_object=tokenizers.Tokenizer.from_str(text), eos_token="<|endoftext|>"
        )

    def setup(self, tokenizer_json: str, vocab: int) -> None:
        # xgrammar reads a transformers tokenizer, and guesses its byte-level kind from it.
        xgrammar = self.module
        tokenizer = self.wrap(tokenizer_json)
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        self.vocab = vocab

    def compile(self, kind: str, source: str):
        xgrammar = self.module
        # Compact JSON, as llguidance is asked for; xgrammar's default separators add spaces.
        compiled = (
            self.compiler.compile_json_schema(source, any_whitespace=False, separators=(",", ":"))
            if kind == "json"
            else self.compiler.compile_regex(source)
        )
        matcher = xgrammar.GrammarMatcher(compiled)
        mask = xgrammar.allocate_token_bitmask(1, self.vocab)
        return (lambda: matcher.fill_next_token_bitmask(mask)), matcher.accept_token


class OutlinesCore(Library):
    name = "outlines-core"

    def load(self) -> None:
        import outlines_core

        self.module = outlines_core

    def setup(self, tokenizer_json: str, vocab: int) -> None:
        # outlines-core takes each token's bytes: the byte-level alphabet is undone here.
        decoder = byte_decoder()
        by_bytes: dict[bytes, list[int]] = {}
        for token, index in json.loads(tokenizer_json)["model"]["vocab"].items():
            if index > 1:  # the two special tokens
                by_bytes.setdefault(bytes(decoder[c] for c in token), []).append(index)
        self.vocabulary = self.module.Vocabulary(0, by_bytes)

    def compile(self, kind: str, source: str):
        from outlines_core.json_schema import build_regex_from_schema

        regex = build_regex_from_schema(source) if kind == "json" else source
        guide = self.module.Guide(self.module.Index(regex, self.vocabulary))
        return guide.get_tokens, guide.advance


def greedy_path(kind: str, source: str) -> list[int]:
    """The engine's greedy tokens under the constraint (the end token left off)."""
    model, tokenizer = llmengine.load_model(kernels="eager"), llmengine.load_tokenizer()
    constraint = Constraint.json_schema(source) if kind == "json" else Constraint.regex(source)
    engine = Engine(model, num_blocks=32, tokenizer=tokenizer)
    params = SamplingParams(max_tokens=120, constraint=constraint)
    tokens = engine.generate([tokenizer.encode("ROMEO:\n")], params)[0]
    return tokens[:-1]


def measure(library: Library, kind: str, source: str, path: list[int]) -> list[float]:
    """The first compile (ms: later ones may be served from a library's own cache), the
    first mask (us: some libraries build their tables lazily), and the median mask (us,
    the median over rounds of each round's median)."""
    compiles, firsts, medians = [], [], []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        step_mask, advance = library.compile(kind, source)
        compiles.append((time.perf_counter() - start) * 1e3)
        times = []
        for token in path:
            start = time.perf_counter()
            step_mask()
            times.append((time.perf_counter() - start) * 1e6)
            advance(token)
        firsts.append(times[0])
        medians.append(statistics.median(times))
    return [compiles[0], firsts[0], statistics.median(medians)]


def main() -> int:
    torch.set_num_threads(1)
    tokenizer_json = (llmengine.embedded_model_path() / "tokenizer.json").read_text()
    vocab = llmengine.LlamaConfig.from_file(
        llmengine.embedded_model_path() / "config.json"
    ).vocab_size
    constraints = {"JSON schema": ("json", json.dumps(SCHEMA)), "regex": ("regex", REGEX)}
    paths = {name: greedy_path(*pair) for name, pair in constraints.items()}
    rows, missing = [], []
    for library in (LLGuidance(), XGrammar(), OutlinesCore()):
        try:
            library.load()
        except ImportError:
            missing.append(library.name)
            continue
        start = time.perf_counter()
        library.setup(tokenizer_json, vocab)
        setup_ms = (time.perf_counter() - start) * 1e3
        version = importlib.metadata.version(library.name)
        for name, (kind, source) in constraints.items():
            rows.append([f"{library.name} {version}", name, len(paths[name]), setup_ms,
                         *measure(library, kind, source, paths[name])])  # fmt: skip
    table = markdown_table(
        rows,
        ["library", "constraint", "steps", "tokenizer setup (ms)", "first compile (ms)",
         "first mask (us)", "mask, median (us)"],
        ["", "", "d", ".1f", ".2f", ".1f", ".1f"],
    )  # fmt: skip
    machine = "\n".join(f"- {key}: {value}" for key, value in machine_description())
    absent = f"\nNot installed here: {', '.join(missing)}.\n" if missing else ""
    text = (
        "# Grammar libraries on the embedded tokenizer\n\n"
        f"Vocabulary of {vocab} tokens; each mask follows the engine's greedy output under the "
        f"constraint; medians of {ROUNDS} rounds.\n\n{table}\n{absent}\n{machine}\n"
    )
    print(text)
    write_report("grammar-libraries", text, wallclock=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

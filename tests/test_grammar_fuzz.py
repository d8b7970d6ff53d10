"""A bounded, seeded fuzz of constrained requests (choice, regex, JSON schema, Lark) with
in-range and extreme sampling values, mixed with unconstrained greedy controls on one
server: no in-range request gets anything but a 200, an out-of-range one gets a 400, every
control equals its lone run, and every output that ends "stop" is in its constraint's
language."""

from __future__ import annotations

import json
import random
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from server_helpers import MODEL_NAME, TIMEOUT, served, sse_payloads

import llmengine

SEED = 33
NUM_REQUESTS = 64
CHOICES = ["aye", "nay", "anon"]
PHRASE = r"[a-z]{1,6}( [a-z]{1,6}){0,2}\."
SCENE = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "act": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["name", "act"],
    "additionalProperties": False,
}
# A context-free language no regex spells: fully bracketed sums and products.
SUMS = 'start: expr\nexpr: NUM | "(" expr OP expr ")"\nOP: "+" | "*"\nNUM: /[0-9]{1,2}/'
CONSTRAINTS = [{"choice": CHOICES}, {"regex": PHRASE}, {"json": SCENE}, {"grammar": SUMS}]
IN_RANGE = {
    "temperature": [0, 1e-3, 0.7, 1.5, 1e4, 1e30, 3e38],
    "top_p": [1.0, 1e-6, 0.5],
    "top_k": [0, 1, 5],
    "presence_penalty": [-2, 0, 2],
    "frequency_penalty": [-2, 0, 2],
    "repetition_penalty": [0.01, 1, 100],
}
OUT_OF_RANGE = [{"temperature": 1e39}, {"temperature": -1}, {"top_p": 0}, {"top_k": -2},
                {"repetition_penalty": 1e3}, {"frequency_penalty": 2.5}]  # fmt: skip
CONTROLS = [{"model": MODEL_NAME, "prompt": prompt, "max_tokens": 24, "temperature": 0}
            for prompt in ("ROMEO:", "JULIET:\n", "Good morrow")]  # fmt: skip


def is_sum(text: str) -> bool:
    """Whether `text` is a sentence of SUMS: a number, or "(" sum op sum ")"."""

    def expr(at: int) -> int | None:  # where the expression starting at `at` ends
        number = re.match(r"[0-9]{1,2}", text[at:])
        if number:
            return at + number.end()
        if text[at : at + 1] != "(":
            return None
        left = expr(at + 1)
        if left is None or text[left : left + 1] not in ("+", "*"):
            return None
        right = expr(left + 1)
        if right is None or text[right : right + 1] != ")":
            return None
        return right + 1

    return expr(0) == len(text)


def in_language(structured: dict, text: str) -> bool:
    if "choice" in structured:
        return text in CHOICES
    if "regex" in structured:
        return re.fullmatch(PHRASE, text) is not None
    if "grammar" in structured:
        return is_sum(text)
    scene = json.loads(text)
    return (set(scene) == {"name", "act"} and isinstance(scene["name"], str)
            and len(scene["name"]) <= 8 and scene["act"] in range(1, 6))  # fmt: skip


def requests(rng: random.Random) -> list[tuple[str, dict]]:
    """(kind, body) for each request: "control", "in-range" or "out-of-range"."""
    made = []
    for index in range(NUM_REQUESTS):
        if index % 4 == 0:
            made.append(("control", CONTROLS[index // 4 % len(CONTROLS)]))
            continue
        body = {"model": MODEL_NAME, "prompt": rng.choice(["ROMEO:", "Speak: ", "KING:\n"]),
                "max_tokens": 40, "structured_outputs": rng.choice(CONSTRAINTS),
                "stream": index % 3 == 0}  # fmt: skip
        body |= {name: rng.choice(values) for name, values in IN_RANGE.items()}
        if rng.random() < 0.5:
            body["seed"] = rng.randrange(2**32)
        if index % 7 == 0:
            made.append(("out-of-range", body | rng.choice(OUT_OF_RANGE)))
        else:
            made.append(("in-range", body))
    return made


def send(url: str, body: dict) -> tuple[int, str | None, str | None]:
    """The status, and for a 200 the text and finish reason (streamed or not)."""
    if not body.get("stream"):
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=TIMEOUT)
        if response.status_code != 200:
            return response.status_code, None, None
        choice = response.json()["choices"][0]
        return 200, choice["text"], choice["finish_reason"]
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=TIMEOUT) as sse:
        if sse.status_code != 200:
            return sse.status_code, None, None
        payloads = sse_payloads(sse.iter_lines())
    if any("error" in payload for payload in payloads):
        return 500, None, None  # the stream's error event: the server failed this request
    choices = [payload["choices"][0] for payload in payloads if payload["choices"]]
    return 200, "".join(choice["text"] for choice in choices), choices[-1]["finish_reason"]


def test_a_seeded_fuzz_of_constraints_and_sampling_values(
    model: llmengine.Llama, tokenizer: Any
) -> None:
    fuzz = requests(random.Random(SEED))
    engine = llmengine.Engine(model, num_blocks=256, num_slots=8)
    with served(engine, tokenizer) as server:
        alone = {body["prompt"]: send(server.url, body) for body in CONTROLS}
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda each: send(server.url, each[1]), fuzz))
    stopped = 0
    for (kind, body), (status, text, finish_reason) in zip(fuzz, answers, strict=True):
        if kind == "control":
            assert (status, text, finish_reason) == alone[body["prompt"]], body
        elif kind == "out-of-range":
            assert status == 400, body
        else:
            assert status == 200, body
            if finish_reason == "stop":
                stopped += 1
                assert in_language(body["structured_outputs"], text), (body, text)
    assert stopped >= NUM_REQUESTS // 4  # the check above ran on many outputs, not a few

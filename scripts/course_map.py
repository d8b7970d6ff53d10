"""Write the README's course map: the lessons in parts, each with its reading time and exercises.

The parts and what each lets a reader do are stated here; each lesson's one-line summary is the
README's own (its row in the map); the reading time (the lesson's prose at 200 words a minute)
and the number of exercises are counted from the notebooks, so they follow every edit.
`make test` runs `tests/test_course_map.py`, which fails when the README's map is stale.

Usage: course_map.py [--check]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"
LESSONS = REPO_ROOT / "lessons"
BEGIN = "<!-- course map: written by scripts/course_map.py -->"
END = "<!-- end of course map -->"
WORDS_PER_MINUTE = 200
ROW = re.compile(r"^\| `(\d\d-[\w-]+)` \| (.*) \|$", re.MULTILINE)


@dataclass(frozen=True)
class Part:
    title: str
    first: int
    last: int
    lets_you: str


PARTS = (
    Part("The model", 1, 4, "build a Llama from its parts, load a Hugging Face checkpoint into "
         "it, and generate text greedily or sampled"),
    Part("The KV cache", 5, 8, "say what a cache saves, lay K/V out in one region per sequence "
         "or in blocks, and price the blocks' unfilled tails"),
    Part("Batching and scheduling", 9, 14, "run many requests through one forward, admit and "
         "preempt them under a block budget, and read the bill preemption leaves"),
    Part("When the pool runs dry", 15, 18, "break the scheduler on purpose and see what catches "
         "it, choose the victim, keep blocks free, and swap instead of recomputing"),
    Part("Serving, speed and scale", 19, 28, "serve the OpenAI API, share prompt prefixes, "
         "chunk long prefills, take a step's cost apart down to this machine's roofline, "
         "split a model across processes, hold a model's output to a grammar, and guess "
         "tokens ahead and check them in one forward"),
    Part("Watching it run", 29, 29, "read a live server's event feed and draw from it, while "
         "it runs, the pool over time, the eviction cascade and the rates"),
    Part("Beside the big engines", 30, 31, "set llmengine beside vLLM, SGLang, llama.cpp and "
         "TensorRT-LLM feature by feature, each claim traced to its documentation, and measure "
         "on llmengine what two of their choices change: how finely a prefix is reused and "
         "what a token of context costs; then take the host's work off one stream's step, as "
         "they do: one call for the whole step, inputs that stay put, the greedy pick in the "
         "graph, the host beside the forward"),
)  # fmt: skip


def lesson_counts(path: Path) -> tuple[int, int]:
    """Words of prose and exercises (code cells after `## Exercises`) in one notebook."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    words, exercises, in_exercises = 0, 0, False
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            words += len(source.split())
            in_exercises = in_exercises or source.startswith("## Exercises")
        elif in_exercises and "llmengine.lessons.exercises." in source:
            exercises += 1
    return words, exercises


def course_map(readme: str) -> str:
    """The map, from the README's lesson rows and the notebooks' counts."""
    summaries = dict(ROW.findall(readme))
    lessons = sorted(path.stem for path in LESSONS.glob("*.ipynb"))
    missing = [name for name in lessons if name not in summaries]
    if missing:
        raise SystemExit(f"README.md has no course-map row for {missing}")
    blocks = []
    for number, part in enumerate(PARTS, start=1):
        names = [name for name in lessons if part.first <= int(name[:2]) <= part.last]
        counts = [lesson_counts(LESSONS / f"{name}.ipynb") for name in names]
        minutes = math.ceil(sum(words for words, _ in counts) / WORDS_PER_MINUTE)
        exercises = sum(found for _, found in counts)
        rows = "".join(f"| `{name}` | {summaries[name]} |\n" for name in names)
        blocks.append(
            f"**Part {number}: {part.title}** (lessons {part.first:02d}-{part.last:02d}; about "
            f"{minutes} minutes of reading, {exercises} exercises). After it you can "
            f"{part.lets_you}.\n\n| lesson | what it shows |\n| --- | --- |\n{rows}"
        )
    return BEGIN + "\n\n" + "\n".join(blocks) + "\n" + END


def updated(readme: str) -> str:
    start, end = readme.index(BEGIN), readme.index(END) + len(END)
    return readme[:start] + course_map(readme) + readme[end:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the map is stale")
    args = parser.parse_args()
    readme = README.read_text(encoding="utf-8")
    new = updated(readme)
    if args.check:
        if new != readme:
            print("README.md's course map is stale: run scripts/course_map.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

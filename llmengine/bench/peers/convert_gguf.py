"""Run llama.cpp's `convert_hf_to_gguf.py` with its BPE pre-tokenizer check answered "gpt-2".

Run by the converter's own Python (`.cache/peers/convert-venv`), not llmengine's:

    python convert_gguf.py LLAMA_CPP_SOURCE CHECKPOINT [convert_hf_to_gguf options...]

The converter identifies a BPE tokenizer's pre-tokenizer by hashing the ids it gives for a
fixed text, and refuses (`BPE pre-tokenizer was not recognized`) any hash it does not list:
the embedded tokenizer is our own BPE, so no hash matches. Its pre-tokenizer is Hugging Face's
ByteLevel with GPT-2's split regex, which is llama.cpp's "gpt-2" pre-tokenizer (the name
`src/llama-vocab.cpp` maps to GPT-2's regex; "gpt2" it rejects), so the check is answered
"gpt-2" here instead of patching the vendored file. The benchmarks feed token ids, so the
tokenizer only matters for text, never for what is timed.
"""

import sys
from pathlib import Path


def main() -> None:
    source, checkpoint, *options = sys.argv[1:]
    sys.path.insert(0, source)
    sys.path.insert(0, str(Path(source) / "gguf-py"))
    import conversion.base

    conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    import convert_hf_to_gguf

    sys.argv = ["convert_hf_to_gguf.py", checkpoint, *options]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()

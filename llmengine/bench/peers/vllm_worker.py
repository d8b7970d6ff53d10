"""vLLM's offline `LLM.generate`, serving requests from llmengine's peers benchmark.

Run by the vLLM venv's Python (`.cache/peers/vllm-venv`), never llmengine's:

    python vllm_worker.py MODEL_DIR MAX_NUM_SEQS MAX_MODEL_LEN

It builds one `LLM` (float32, no tokenizer: prompts and outputs are token ids), prints one
JSON line `{"ready": true, "version": ...}`, then answers each JSON line on stdin,
`{"prompts": [[ids]], "max_tokens": [n]}`, with `{"seconds": s, "outputs": [[ids]]}`: greedy,
`ignore_eos`, timed around the one `generate` call. An empty line or end of input stops it.
`LLM()` is built under `if __name__ == "__main__"` because vLLM may start worker processes
that import this file again.
"""

import json
import sys
import time


def main() -> None:
    model, max_num_seqs, max_model_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    import vllm

    llm = vllm.LLM(
        model=model,
        dtype="float32",
        skip_tokenizer_init=True,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        seed=0,
    )
    print(json.dumps({"ready": True, "version": vllm.__version__}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        request = json.loads(line)
        prompts = [{"prompt_token_ids": ids} for ids in request["prompts"]]
        params = [
            vllm.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)
            for n in request["max_tokens"]
        ]
        start = time.perf_counter()
        results = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        outputs = [list(result.outputs[0].token_ids) for result in results]
        print(json.dumps({"seconds": seconds, "outputs": outputs}), flush=True)


if __name__ == "__main__":
    main()

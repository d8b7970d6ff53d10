"""The bench layer: workloads, batchbench and what it measures, above the serving core.

It drives engines through their public interface and reads their `IterationOutcome`s, never
their internals: workloads (`workloads`), clocks and timing (`clocks`, `timing`), the pool
sweep (`batchbench`) and its report (`report`), the static-batching baseline (`static_batch`),
the decode-step benchmark (`decode_step`), the comparison with transformers (`throughput`),
batchbench over HTTP against any OpenAI-compatible server (`http_client`, `serving_report`),
and one burst timed on a GPU, against its targets (`gpu_burst`, `gpu_targets`).
Nothing here imports the lessons layer.
"""

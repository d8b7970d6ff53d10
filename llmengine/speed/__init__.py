"""What makes a loaded model fast without changing what it computes: fused projections,
kernels chosen by measurement, int8 weights, compiled layer halves and the decode graph.
A reader may skip this package; `llmengine.model` reads the same without it."""

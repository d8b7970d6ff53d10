"""Constrained decoding: a grammar turned into a mask over each step's logits."""

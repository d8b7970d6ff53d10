"""Speculative decoding: a cheap proposer guesses tokens, one forward of the model checks them."""

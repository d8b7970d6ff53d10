"""The model as a reader meets it: the Llama, its configuration and rotary embedding, the
checkpoint loader and the tokenizer. Nothing here knows about caches, batches or speed."""

"""llmengine: an LLM inference engine built from scratch, one measured lesson at a time."""

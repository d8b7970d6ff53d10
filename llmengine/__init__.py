"""llmengine: an LLM inference engine built from scratch, one measured lesson at a time."""

from llmengine.generation import generate_tokens as generate_tokens
from llmengine.sampling import SamplingParams as SamplingParams

"""llmengine: an LLM inference engine built from scratch, one measured lesson at a time."""

from llmengine.blocks import BlockPool as BlockPool
from llmengine.blocks import BlockTable as BlockTable
from llmengine.blocks import blocks_for_length as blocks_for_length
from llmengine.config import LlamaConfig as LlamaConfig
from llmengine.contiguous_cache import ContiguousKVCache as ContiguousKVCache
from llmengine.contiguous_cache import contiguous_forward as contiguous_forward
from llmengine.engine import Engine as Engine
from llmengine.generation import generate_tokens as generate_tokens
from llmengine.loader import embedded_model_path as embedded_model_path
from llmengine.loader import load_model as load_model
from llmengine.model import AttentionHook as AttentionHook
from llmengine.model import Llama as Llama
from llmengine.outcome import IterationOutcome as IterationOutcome
from llmengine.paged_cache import PagedKVCache as PagedKVCache
from llmengine.paged_cache import PagedRow as PagedRow
from llmengine.paged_cache import paged_forward as paged_forward
from llmengine.request import Request as Request
from llmengine.request import RequestState as RequestState
from llmengine.sampling import SamplingParams as SamplingParams
from llmengine.scheduler import Scheduler as Scheduler
from llmengine.tokenizer import load_tokenizer as load_tokenizer

"""hetero-infer: a paged-attention LLM inference engine with an OpenAI-compatible server."""

from hetero_infer.worker.llm import LLM
from hetero_infer.worker.outputs import CompletionOutput, RequestOutput
from hetero_infer.worker.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"

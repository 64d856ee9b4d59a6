"""hetero-infer: a paged-attention LLM inference engine with an OpenAI-compatible server.

`from hetero_infer import LLM, SamplingParams`. Names load lazily so that the operator
(`hetero_infer.operator`) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]

_LAZY = {
    "LLM": "hetero_infer.worker.llm",
    "SamplingParams": "hetero_infer.worker.sampling_params",
    "RequestOutput": "hetero_infer.worker.outputs",
    "CompletionOutput": "hetero_infer.worker.outputs",
}

if TYPE_CHECKING:
    from hetero_infer.worker.llm import LLM
    from hetero_infer.worker.outputs import CompletionOutput, RequestOutput
    from hetero_infer.worker.sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hetero_infer' has no attribute {name!r}")

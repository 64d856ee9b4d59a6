"""hetero-infer: a paged-attention LLM inference engine with an OpenAI-compatible server.

`from hetero_infer import LLM, SamplingParams`. Names load lazily so that the operator
(`hetero_infer.operator`) does not import torch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# The operator's modules live in the repository's top-level operator/ folder, which has no __init__.py:
# as a regular package it would shadow the standard library's `operator` for any Python started in the
# repository root. A wheel installs the folder as hetero_infer/operator/ (a namespace subpackage). An
# editable install cannot map a namespace subpackage onto another folder (setuptools issue 4248), and a
# checkout used without installing has no mapping at all: there the repository root is searched as well.
_here = os.path.dirname(os.path.abspath(__file__))
if not os.path.isdir(os.path.join(_here, "operator")) and os.path.isdir(os.path.join(_here, "..", "operator")):
    __path__.append(os.path.dirname(_here))
del _here

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "RequestOutput", "CompletionOutput", "LoRARequest"]

_LAZY = {
    "LLM": "hetero_infer.worker.frontend.llm",
    "SamplingParams": "hetero_infer.contracts.sampling_params",
    "StructuredOutputsParams": "hetero_infer.contracts.sampling_params",
    "RequestOutput": "hetero_infer.worker.core.outputs",
    "CompletionOutput": "hetero_infer.worker.core.outputs",
    "LoRARequest": "hetero_infer.contracts.lora",
}

if TYPE_CHECKING:
    from hetero_infer.contracts.lora import LoRARequest
    from hetero_infer.contracts.sampling_params import SamplingParams, StructuredOutputsParams
    from hetero_infer.worker.core.outputs import CompletionOutput, RequestOutput
    from hetero_infer.worker.frontend.llm import LLM


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hetero_infer' has no attribute {name!r}")

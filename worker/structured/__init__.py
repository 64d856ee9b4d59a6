"""Structured outputs: a request's `StructuredOutputsParams` (JSON schema, regex, choice, EBNF grammar, any
JSON object) compiled with xgrammar into a token mask that the batched sampler applies to its logits row.

- `spec`: the constraint as a hashable spec and its tokenizer-free grammar (validation, ConstraintError)
- `check`: the request-time check of `structured_outputs` and `logit_bias`
- `compiler`: grammars compiled against the engine's vocabulary, cached per spec, off the engine loop
- `matcher`: one sequence's state in its grammar
- `mask`: the batched mask over a step's logits
"""

from hetero_infer.worker.structured.check import check_constraints
from hetero_infer.worker.structured.compiler import CompileTimeout, GrammarCache, tokenizer_info_from_hf
from hetero_infer.worker.structured.matcher import GrammarState
from hetero_infer.worker.structured.spec import ConstraintError, GrammarSpec, build_grammar, spec_of

__all__ = ["CompileTimeout", "ConstraintError", "GrammarCache", "GrammarSpec", "GrammarState", "build_grammar", "check_constraints",
           "spec_of", "tokenizer_info_from_hf"]

"""The request-time check of the constraint fields (`logit_bias`, `structured_outputs`), called from
`request_check.check_request`: a request without them pays two attribute reads."""

from __future__ import annotations

from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.structured.spec import ConstraintError, build_grammar, spec_of

LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range for a bias value


def check_constraints(params: SamplingParams, vocab_size: int, parse_grammar: bool = True) -> None:
    """ConstraintError (a ValueError naming the field) for an unusable logit_bias or structured_outputs
    (`parse_grammar=False`: its shape only; parsing a large schema takes a while, and xgrammar's import longer)."""
    if params.logit_bias:
        _check_logit_bias(params.logit_bias, vocab_size)
    if params.structured_outputs is not None:
        spec = spec_of(params.structured_outputs)
        if parse_grammar:
            build_grammar(spec)


def _check_logit_bias(bias: dict, vocab_size: int) -> None:
    if not isinstance(bias, dict):
        raise ConstraintError("logit_bias must map token ids to numbers", "logit_bias")
    for token, value in bias.items():
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
            raise ConstraintError(f"logit_bias: token id {token!r} is not an integer in [0, {vocab_size})",
                                  "logit_bias")
        if isinstance(value, bool) or not isinstance(value, int | float) or not (
                -LOGIT_BIAS_LIMIT <= value <= LOGIT_BIAS_LIMIT):
            raise ConstraintError(f"logit_bias: the bias of token {token} must be a number in "
                                  f"[-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}], got {value!r}", "logit_bias")

"""A request's constraint as a hashable spec (the cache key) and its tokenizer-free xgrammar `Grammar`; both
raise `ConstraintError` naming what is wrong, so a bad schema, regex or grammar is refused before it is
queued."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from hetero_infer.contracts.sampling_params import StructuredOutputsParams

if TYPE_CHECKING:
    import xgrammar

_KINDS = ("json", "regex", "choice", "grammar", "json_object")


class ConstraintError(ValueError):
    """An unusable constraint; `param` names the field (request_check turns it into a 400)."""

    def __init__(self, message: str, param: str = "structured_outputs") -> None:
        super().__init__(message)
        self.param = param

    def __reduce__(self) -> tuple:  # crosses the engine process's pipe with its field
        return type(self), (str(self), self.param)


@dataclass(frozen=True)
class GrammarSpec:
    kind: str  # one of _KINDS
    source: str  # the schema's canonical JSON text, the regex, the EBNF, or the choices as a JSON list
    any_whitespace: bool = True


def spec_of(params: StructuredOutputsParams) -> GrammarSpec:
    """The spec of a request's `structured_outputs` (exactly one kind set)."""
    given = [k for k in _KINDS if getattr(params, k) not in (None, False)]
    if len(given) != 1:
        raise ConstraintError(
            f"structured_outputs needs exactly one of {', '.join(_KINDS)}; got {', '.join(given) or 'none'}")
    kind = given[0]
    value = getattr(params, kind)
    any_ws = not params.disable_any_whitespace
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ConstraintError(f"the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ConstraintError(f"a JSON schema must be an object, got {type(value).__name__}")
        return GrammarSpec("json", json.dumps(value), any_ws)  # key order kept: it is the output order
    if kind == "json_object":
        return GrammarSpec("json_object", "", any_ws)
    if kind == "choice":
        if not isinstance(value, list | tuple) or not value or not all(isinstance(c, str) for c in value):
            raise ConstraintError("choice must be a non-empty list of strings")
        return GrammarSpec("choice", json.dumps(list(value)), any_ws)
    if not isinstance(value, str) or not value:
        raise ConstraintError(f"{kind} must be a non-empty string")
    return GrammarSpec(kind, value, any_ws)


@lru_cache(maxsize=256)
def build_grammar(spec: GrammarSpec) -> xgrammar.Grammar:
    """The spec parsed into a grammar (no tokenizer needed); ConstraintError if it does not parse."""
    import xgrammar as xgr

    try:
        if spec.kind == "json":
            return xgr.Grammar.from_json_schema(spec.source, any_whitespace=spec.any_whitespace,
                                                **_separators(spec))
        if spec.kind == "json_object":
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=spec.any_whitespace,
                                                **_separators(spec))
        if spec.kind == "regex":
            return xgr.Grammar.from_regex(spec.source)
        if spec.kind == "choice":
            # JSON string escapes are valid EBNF string literals, but only as UTF-8: `\\uXXXX` escapes each
            # UTF-16 half of a character beyond U+FFFF on its own (U+1F30D became two bad 3-byte sequences).
            alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in json.loads(spec.source))
            return xgr.Grammar.from_ebnf(f"root ::= {alternatives}")
        return xgr.Grammar.from_ebnf(spec.source)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ConstraintError(f"invalid {_NAMES[spec.kind]}: {_first_line(exc)}") from None


_NAMES = {"json": "JSON schema", "json_object": "JSON object", "regex": "regex", "choice": "choice",
          "grammar": "grammar (EBNF)"}


def _separators(spec: GrammarSpec) -> dict:
    # Without free whitespace, the compact separators (xgrammar would otherwise force ", " and ": ").
    return {} if spec.any_whitespace else {"separators": (",", ":")}


def _first_line(exc: Exception) -> str:
    """The message without xgrammar's "[time] file.cc:line: " prefix."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", line)

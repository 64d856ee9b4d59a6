"""Grammars compiled against the engine's vocabulary, once per spec: the tokenizer's xgrammar view is built on
the first constrained request (so an engine that never sees one never imports xgrammar), compiled grammars
are kept in a bounded LRU keyed by `GrammarSpec`."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hetero_infer.worker.structured.matcher import GrammarState
from hetero_infer.worker.structured.spec import GrammarSpec, build_grammar, spec_of

if TYPE_CHECKING:
    import xgrammar

    from hetero_infer.worker.core.sampling_params import StructuredOutputsParams


def tokenizer_info_from_hf(hf_tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> xgrammar.TokenizerInfo:
    """xgrammar's view of a Hugging Face tokenizer; `vocab_size` is the model's logits width (it may exceed the
    tokenizer's), `stop_token_ids` the engine's EOS ids (the only tokens allowed once the grammar is done).
    Kept per (tokenizer folder, vocab size, stop ids): building one walks the whole vocabulary (seconds)."""
    key = (getattr(hf_tokenizer, "name_or_path", None) or id(hf_tokenizer), vocab_size, tuple(stop_token_ids))
    info = _INFOS.get(key)
    if info is None:
        import xgrammar as xgr

        info = _INFOS[key] = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size,
                                                                stop_token_ids=list(stop_token_ids))
    return info


_INFOS: dict[tuple, xgrammar.TokenizerInfo] = {}


class GrammarCache:
    """Compiles each spec once; `new_state` hands every sequence its own matcher over the shared grammar."""

    def __init__(self, tokenizer_info: Callable[[], xgrammar.TokenizerInfo], max_entries: int = 256) -> None:
        self._make_info = tokenizer_info
        self._compiler: xgrammar.GrammarCompiler | None = None
        self._compiled: OrderedDict[GrammarSpec, xgrammar.CompiledGrammar] = OrderedDict()
        self.max_entries = max_entries
        self.compilations = 0  # grammars compiled so far (cache misses)

    def compile(self, spec: GrammarSpec) -> xgrammar.CompiledGrammar:
        compiled = self._compiled.get(spec)
        if compiled is not None:
            self._compiled.move_to_end(spec)
            return compiled
        if self._compiler is None:
            import xgrammar as xgr

            # The engine thread compiles; xgrammar's own cache would only duplicate ours.
            self._compiler = xgr.GrammarCompiler(self._make_info(), max_threads=1, cache_enabled=False)
        compiled = self._compiler.compile_grammar(build_grammar(spec))
        self.compilations += 1
        self._compiled[spec] = compiled
        if len(self._compiled) > self.max_entries:
            self._compiled.popitem(last=False)
        return compiled

    def new_state(self, params: StructuredOutputsParams) -> GrammarState:
        return GrammarState(self.compile(spec_of(params)))

"""Grammar-engine comparison for structured outputs (docs/benchmarks.md, "Structured outputs").

For xgrammar, llguidance and outlines-core on the default model's tokenizer: the one-off tokenizer set-up,
each JSON schema's compile time (cold: no cache) and the per-token time of computing the next-token mask and
advancing the matcher, walking the tokens of a valid document. Not part of the package: run it by hand,
`python benchmarks/structured_backends.py` (the three engines must be installed).
"""

from __future__ import annotations

import json
import statistics
import time
from functools import partial

import torch

from hetero_infer.contracts.tokenizer import Tokenizer
from hetero_infer.worker.runner.loader import resolve_model

SCHEMAS = {
    "flat": ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]},
             {"name": "Ada Lovelace", "age": 36}),
    "nested+enum+array": (
        {"type": "object",
         "properties": {
             "id": {"type": "integer"},
             "status": {"enum": ["active", "inactive", "banned"]},
             "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
             "address": {"type": "object",
                         "properties": {"street": {"type": "string"}, "zip": {"type": "string",
                                                                              "pattern": "^[0-9]{5}$"}},
                         "required": ["street", "zip"]}},
         "required": ["id", "status", "tags", "address"]},
        {"id": 7, "status": "active", "tags": ["a", "bb", "ccc"], "address": {"street": "Main St 1",
                                                                              "zip": "12345"}}),
    "wide (20 fields)": (
        {"type": "object", "properties": {f"field_{i}": {"type": ["string", "number", "boolean"]}
                                          for i in range(20)},
         "required": [f"field_{i}" for i in range(20)]},
        {f"field_{i}": (i if i % 3 == 0 else (f"v{i}" if i % 3 == 1 else True)) for i in range(20)}),
}


def _time(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


class XGrammar:
    name = "xgrammar"

    def __init__(self, tok: Tokenizer) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tok.hf, vocab_size=tok.vocab_size,
                                                       stop_token_ids=sorted(tok.eos_token_ids))
        self.vocab = tok.vocab_size

    def compile(self, schema):
        compiler = self.xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        return compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))

    def walk(self, compiled, tokens):
        m = self.xgr.GrammarMatcher(compiled)
        mask = self.xgr.allocate_token_bitmask(1, self.vocab)
        for t in tokens:
            m.fill_next_token_bitmask(mask)
            assert m.accept_token(t)


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok: Tokenizer) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.ll = llguidance
        self.tok = llguidance.hf.from_tokenizer(tok.hf, n_vocab=tok.vocab_size)
        self.vocab = tok.vocab_size

    def compile(self, schema):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(json.dumps(schema),
                                                              defaults={"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"})
        m = self.ll.LLMatcher(self.tok, grammar)  # lazy: the first mask does most of the work
        mask = self.ll.torch.allocate_token_bitmask(1, self.vocab)
        self.ll.torch.fill_next_token_bitmask(m, mask, 0)
        assert not m.is_error(), m.get_error()
        return grammar

    def walk(self, grammar, tokens):
        m = self.ll.LLMatcher(self.tok, grammar)
        mask = self.ll.torch.allocate_token_bitmask(1, self.vocab)
        for t in tokens:
            self.ll.torch.fill_next_token_bitmask(m, mask, 0)
            assert m.consume_token(t), m.get_error()


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tok: Tokenizer) -> None:
        import outlines_core
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        self.oc = outlines_core
        byte_of = {c: b for b, c in bytes_to_unicode().items()}
        special = set(tok.hf.all_special_ids)
        eos = min(tok.eos_token_ids)
        vocab: dict[bytes, list[int]] = {}
        for text, i in tok.hf.get_vocab().items():
            if i in special or i == eos:
                continue
            vocab.setdefault(bytes(byte_of[c] for c in text), []).append(i)
        self.vocabulary = outlines_core.Vocabulary(eos, vocab)
        self.vocab = tok.vocab_size

    def compile(self, schema):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema), whitespace_pattern="")
        return self.oc.Index(regex, self.vocabulary)

    def walk(self, index, tokens):
        guide = self.oc.Guide(index)
        mask = torch.zeros((self.vocab + 31) // 32, dtype=torch.int32)
        for t in tokens:
            guide.write_mask_into(mask.data_ptr(), mask.numel(), mask.element_size())
            guide.advance(t)


def main() -> None:
    folder, name = resolve_model(None)
    tok = Tokenizer.from_pretrained(folder)
    print(f"model {name}, vocab {tok.vocab_size}, torch threads {torch.get_num_threads()}")
    rows = []
    for cls in (XGrammar, LLGuidance, OutlinesCore):
        t = time.perf_counter()
        engine = cls(tok)
        setup = time.perf_counter() - t
        for label, (schema, doc) in SCHEMAS.items():
            tokens = tok.encode(json.dumps(doc, separators=(",", ":")), add_special_tokens=False)
            compile_s = _time(partial(engine.compile, schema))
            compiled = engine.compile(schema)
            walk = partial(engine.walk, compiled, tokens)
            per_token = [_time(walk) / len(tokens) for _ in range(3)]
            rows.append((engine.name, setup, label, compile_s, statistics.median(per_token), len(tokens)))
    print("| engine | tokenizer set-up (s) | schema | compile (ms) | mask+advance per token (us) | tokens |")
    print("|---|---|---|---|---|---|")
    for eng, setup, label, c, pt, n in rows:
        print(f"| {eng} | {setup:.2f} | {label} | {c * 1e3:.1f} | {pt * 1e6:.0f} | {n} |")


if __name__ == "__main__":
    main()

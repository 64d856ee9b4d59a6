"""Loaded by every Python process started with this folder on PYTHONPATH (the server and its engine process):
xgrammar's compile of a grammar that names `SLOW_COMPILE_MARKER` takes `SLOW_COMPILE_S` seconds longer, on any
xgrammar release. The grammar-compile tests need a compile that is slow by construction: a schema that happened
to be slow on one release (xgrammar 0.2.8: 2.5-3 s) compiled in 15 ms on the next (0.2.9).

The delay is a sleep on the compiling thread, as a real compile is (xgrammar releases the GIL while it
compiles): a compile done on the engine loop would still pause every stream for the whole delay."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time

SLOW_COMPILE_MARKER = "slow_compile_marker"


def _patch(xgrammar) -> None:
    delay = float(os.environ.get("SLOW_COMPILE_S", "8"))
    compile_grammar = xgrammar.GrammarCompiler.compile_grammar

    def slow_compile_grammar(self, grammar, *args, **kwargs):
        if SLOW_COMPILE_MARKER in str(grammar):
            time.sleep(delay)
        return compile_grammar(self, grammar, *args, **kwargs)

    xgrammar.GrammarCompiler.compile_grammar = slow_compile_grammar


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches xgrammar when it is first imported (the engine imports it on the first constrained request)."""

    def find_spec(self, name, path, target=None):
        if name != "xgrammar":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


sys.meta_path.insert(0, _PatchOnImport())

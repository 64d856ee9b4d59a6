"""Grammars compiled against the engine's vocabulary, once per spec: the tokenizer's xgrammar view is built on
the first constrained request (so an engine that never sees one never imports xgrammar), compiled grammars
are kept in a bounded LRU keyed by `GrammarSpec`.

A server compiles off the engine loop: `prepare(spec)` compiles on a small pool of threads (xgrammar releases
the GIL while it compiles) and the request is queued only once its grammar is in the cache, so the loop that
steps only ever finds it there (`new_state`). A new schema costs its own request the compile time, nobody
else's stream a pause. Direct callers (`LLM`, tests) may skip `prepare`: `new_state` then compiles inline."""

from __future__ import annotations

import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hetero_infer.worker.structured.matcher import GrammarState
from hetero_infer.worker.structured.spec import ConstraintError, GrammarSpec, build_grammar, spec_of

if TYPE_CHECKING:
    import xgrammar

    from hetero_infer.contracts.sampling_params import StructuredOutputsParams

# Grammars compiled at once: each compile takes one core (xgrammar max_threads=1). A client that sends slow
# schemas can keep these busy (other new schemas then wait, and time out); cached grammars and unconstrained
# requests never wait for them.
COMPILE_THREADS = 2


class CompileTimeout(TimeoutError):
    """A `prepare` whose compile had not started by its deadline (its caller has given up on it)."""


def tokenizer_info_from_hf(hf_tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> xgrammar.TokenizerInfo:
    """xgrammar's view of a Hugging Face tokenizer; `vocab_size` is the model's logits width (it may exceed the
    tokenizer's), `stop_token_ids` the engine's EOS ids (the only tokens allowed once the grammar is done).
    Kept per (tokenizer folder, vocab size, stop ids): building one walks the whole vocabulary (seconds)."""
    key = (getattr(hf_tokenizer, "name_or_path", None) or id(hf_tokenizer), vocab_size, tuple(stop_token_ids))
    with _INFOS_LOCK:
        info = _INFOS.get(key)
        if info is None:
            import xgrammar as xgr

            info = _INFOS[key] = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size,
                                                                    stop_token_ids=list(stop_token_ids))
    return info


_INFOS: dict[tuple, xgrammar.TokenizerInfo] = {}
_INFOS_LOCK = threading.Lock()


@dataclass
class _Pending:
    future: Future[None]
    deadline: float | None  # time.monotonic(); None: whoever waits, waits for ever


class GrammarCache:
    """Compiles each spec once; `new_state` hands every sequence its own matcher over the shared grammar.
    Thread-safe: `prepare` is called from a frontend (the event loop, or the engine process's command reader),
    `new_state` from the engine loop."""

    def __init__(self, tokenizer_info: Callable[[], xgrammar.TokenizerInfo], max_entries: int = 256,
                 threads: int = COMPILE_THREADS) -> None:
        self._make_info = tokenizer_info
        self._compiler: xgrammar.GrammarCompiler | None = None
        self._compiled: OrderedDict[GrammarSpec, xgrammar.CompiledGrammar] = OrderedDict()
        self._pending: dict[GrammarSpec, _Pending] = {}
        self._lock = threading.Lock()  # held briefly: `prepare` runs on an event loop
        self._compiler_lock = threading.Lock()  # held while the tokenizer's view is built (seconds, once)
        self._threads = threads
        self._queue: queue.SimpleQueue[tuple[GrammarSpec, _Pending]] | None = None
        self.max_entries = max_entries
        self.compilations = 0  # grammars compiled so far (cache misses)

    def compile(self, spec: GrammarSpec) -> xgrammar.CompiledGrammar:
        """The spec's compiled grammar: from the cache, or compiled here, on the caller's thread."""
        with self._lock:
            compiled = self._compiled.get(spec)
            if compiled is not None:
                self._compiled.move_to_end(spec)
                return compiled
        compiled = self._xgrammar_compiler().compile_grammar(build_grammar(spec))
        with self._lock:
            self.compilations += 1
            self._compiled[spec] = compiled
            if len(self._compiled) > self.max_entries:
                self._compiled.popitem(last=False)
        return compiled

    def prepare(self, spec: GrammarSpec, deadline: float | None = None) -> Future[None]:
        """Compile the spec on the pool (at most once at a time per spec); the future is done once it is in the
        cache, or fails with ConstraintError (it does not compile) or CompileTimeout (still queued at
        `deadline`, a `time.monotonic()` time: nobody waits for it any more, so it is not compiled)."""
        with self._lock:
            if spec in self._compiled:
                self._compiled.move_to_end(spec)
                done: Future[None] = Future()
                done.set_result(None)
                return done
            pending = self._pending.get(spec)
            if pending is not None:  # compiling or queued already: wait for that one
                if pending.deadline is not None:
                    pending.deadline = None if deadline is None else max(pending.deadline, deadline)
                return pending.future
            pending = self._pending[spec] = _Pending(Future(), deadline)
            if self._queue is None:
                self._queue = queue.SimpleQueue()
                # Daemon threads: a compile cannot be interrupted, and must not hold up the process's exit.
                for i in range(self._threads):
                    threading.Thread(target=self._compile_loop, args=(self._queue,), name=f"grammar-compile-{i}",
                                     daemon=True).start()
            self._queue.put((spec, pending))
        return pending.future

    def _compile_loop(self, jobs: queue.SimpleQueue) -> None:
        while (job := jobs.get()) is not None:
            self._compile_pending(*job)

    def _compile_pending(self, spec: GrammarSpec, pending: _Pending) -> None:
        error: BaseException | None = None
        if pending.deadline is not None and time.monotonic() > pending.deadline:
            error = CompileTimeout("the grammar was still waiting to be compiled at its deadline")
        else:
            try:
                self.compile(spec)
            except ConstraintError as exc:
                error = exc
            except Exception as exc:  # xgrammar's own error: the request's, never the engine's
                error = ConstraintError(f"the grammar could not be compiled: {type(exc).__name__}: {exc}")
        with self._lock:
            self._pending.pop(spec, None)
        try:
            if error is None:
                pending.future.set_result(None)
            else:
                pending.future.set_exception(error)
        except InvalidStateError:  # a caller cancelled the shared future (the compile thread lives on)
            pass

    def _xgrammar_compiler(self) -> xgrammar.GrammarCompiler:
        with self._compiler_lock:
            if self._compiler is None:
                import xgrammar as xgr

                # Our cache keys on the spec; xgrammar's own cache would only duplicate it.
                self._compiler = xgr.GrammarCompiler(self._make_info(), max_threads=1, cache_enabled=False)
            return self._compiler

    def new_state(self, params: StructuredOutputsParams) -> GrammarState:
        return GrammarState(self.compile(spec_of(params)))


"""Keep the objects of start-up (modules, the model, the tokenizer: several 100k) out of the garbage collector's
reach once loading is over."""

from __future__ import annotations

import atexit
import gc


def freeze_startup_objects() -> None:
    """`gc.freeze()` what exists now. Otherwise every full collection, which the objects of requests in flight
    trigger under load, walks all of them again (0.2 to 0.3 s each, every second or so: a fifth of the server's
    CPU in one measurement). They are unfrozen at exit, so that finalization still releases them: objects left
    frozen count as leaked, and the extension modules that check for leaks (triton's nanobind bindings, loaded
    with torch) print hundreds of lines about it."""
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)

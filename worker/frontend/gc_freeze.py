"""Keep the objects of start-up (modules, the model, the tokenizer: several 100k) out of the garbage collector's
reach once loading is over, and collect the young generation less often while serving."""

from __future__ import annotations

import atexit
import gc

# Young-generation threshold while serving (Python's default: 700). Counted in allocations net of
# deallocations: the objects of requests and outputs mostly die by reference counting, so in steady state
# this threshold is rarely reached, where the default one triggered ~30 young collections per second on the
# event loop at 64 streams (0.5-1 ms each, ~3% of the loop's time).
YOUNG_THRESHOLD = 20_000


def freeze_startup_objects() -> None:
    """`gc.freeze()` what exists now. Otherwise every full collection, which the objects of requests in flight
    trigger under load, walks all of them again (0.2 to 0.3 s each, every second or so: a fifth of the server's
    CPU in one measurement). They are unfrozen at exit, so that finalization still releases them: objects left
    frozen count as leaked, and the extension modules that check for leaks (triton's nanobind bindings, loaded
    with torch) print hundreds of lines about it. Then the young generation's threshold becomes
    `YOUNG_THRESHOLD`."""
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)

"""The engine core's LoRA adapters: which are read into host memory (an LRU of `max_cpu_loras`, as vLLM's CPU
cache), loading on demand, and what the metrics report of them.

The host cache is a cache: every request carries its whole `LoRARequest`, so an adapter evicted (or removed) is
read again from its path when a request names it. Adapters that unfinished requests run with are never evicted:
while every cached adapter has some, the cache holds more than `max_cpu_loras`, down again as they end. One
removed while requests still run with it is dropped from the executor once they have ended (it is listed no more
at once). The device slots (`max_loras`) are the executor's (worker/runner/lora/slots.py); the scheduler
keeps a step within them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from hetero_infer.contracts.lora import LoRAAdapterError, LoRARequest


class LoRARegistry:
    """`executor`: what reads adapters (`add_lora`, `remove_lora`); `in_use`: the adapters unfinished requests
    run with; `model_name`: the served name a request's `base_model_name` must match."""

    def __init__(self, executor: Any, capacity: int, in_use: Callable[[], set[str]], model_name: str) -> None:
        self.executor = executor
        self.capacity = capacity
        self.in_use = in_use
        self.model_name = model_name
        self.loaded: OrderedDict[str, LoRARequest] = OrderedDict()  # least recently used first
        self.draining: dict[str, LoRARequest] = {}  # removed, in the executor until their requests end
        self.requests_total: dict[str, int] = {}  # requests added per adapter

    def list(self) -> list[LoRARequest]:
        return list(self.loaded.values())

    def add(self, request: LoRARequest) -> None:
        """Make `request`'s adapter loaded (read and checked on first use, else marked recently used);
        LoRAAdapterError, and no change, for a bad or conflicting one."""
        if not isinstance(request, LoRARequest):
            raise LoRAAdapterError(f"lora_request must be a LoRARequest, not {type(request).__name__}")
        name = request.lora_name
        known = self.loaded.get(name) or self.draining.get(name)
        if known is not None:
            if known != request:
                raise LoRAAdapterError(f"a LoRA adapter named {name!r} is already loaded ({known.lora_path}, id "
                                       f"{known.lora_int_id}): remove it first, or give this one another name")
            if name in self.draining:
                del self.draining[name]
                self.loaded[name] = request
            self.loaded.move_to_end(name)
            return
        if request.base_model_name is not None and request.base_model_name != self.model_name:
            raise LoRAAdapterError(f"LoRA adapter {name!r} is for base model {request.base_model_name!r}; this "
                                   f"engine serves {self.model_name!r}")
        for other in (*self.loaded.values(), *self.draining.values()):
            if other.lora_int_id == request.lora_int_id:
                raise LoRAAdapterError(f"lora_int_id {request.lora_int_id} is already used by LoRA adapter "
                                       f"{other.lora_name!r}")
        self.executor.add_lora(request)  # reads and checks it: LoRAAdapterError before anything changed
        self.loaded[name] = request
        if len(self.loaded) > self.capacity:
            self.drain(keep=name)

    def remove(self, name: str) -> bool:
        """Unload adapter `name` (False: none by that name); requests still running with it finish with it."""
        request = self.loaded.pop(name, None)
        if request is None:
            return False
        if name in self.in_use():
            self.draining[name] = request
        else:
            self.executor.remove_lora(name)
        return True

    @property
    def needs_drain(self) -> bool:
        return bool(self.draining) or len(self.loaded) > self.capacity

    def drain(self, keep: str | None = None) -> None:
        """Drop from the executor the removed adapters whose requests have all ended, and the least recently used
        ones without requests (but `keep`) while the cache holds more than its capacity."""
        busy = self.in_use()
        if keep is not None:
            busy.add(keep)
        for name in [n for n in self.draining if n not in busy]:
            del self.draining[name]
            self.executor.remove_lora(name)
        for name in [n for n in self.loaded if n not in busy][:max(len(self.loaded) - self.capacity, 0)]:
            del self.loaded[name]
            self.executor.remove_lora(name)

    def counted(self, name: str) -> None:
        self.requests_total[name] = self.requests_total.get(name, 0) + 1


def adapter_names(seqs: Iterable[Any]) -> tuple[str, ...]:
    """The distinct adapters of `seqs`, in order of first appearance."""
    return tuple(dict.fromkeys(s.lora_name for s in seqs if s.lora_name is not None))

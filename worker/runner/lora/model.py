"""LoRA adapters on a loaded model: the device slots' stacked weights of every projection adapters may update, the
step's token -> slot map, and the forward hooks that add each token's adapter update to a projection's output.

Each target projection (a layer's fused q/k/v, o, fused gate/up, down) holds `a [max_loras, n * R, in]` and
`b [max_loras, out, R]`, `n` its output slices (q, k, v: 3; gate, up: 2; else 1), `R` = max_lora_rank: an
adapter's rank-r A of slice i fills rows i*R .. i*R+r of its slot's `a`, its B (times the PEFT scale) the slice's
output rows and first r columns of `b`, zeros elsewhere (smaller ranks padded). Then per token
`y = a[s] @ x`, `out[slice i] += b[s, slice i] @ y[i*R:(i+1)*R]` (kernels.lora_apply) is exactly PEFT's
`base(x) + B(A(x)) * scale` of every targeted slice.

The hooks run only in a step that has adapters (`begin_step`): a step of the base model alone goes through the
model as without LoRA (the executors' fused paths included). The base weights may be in any format (float,
INT8, INT4, packed for the CPU GEMMs): the update applies to the projection's input and output activations.
On CUDA the token -> slot map is copied into a static buffer that the kernels read on the device: the CUDA-graph
decode runner captures its LoRA graphs inside `graph_step` (every target's kernels, the buffer's first rows as the
map), and each replay runs whatever adapters `begin_step` wrote there (rows past the step's tokens: -1).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch import nn

from hetero_infer import kernels
from hetero_infer.contracts.lora import LoRAAdapterError, LoRARequest
from hetero_infer.contracts.step import StepPlan
from hetero_infer.kernels.cpu import decode_step as fused_step
from hetero_infer.worker.runner.lora.adapter import AdapterWeights, ModelShapes, load_adapter
from hetero_infer.worker.runner.lora.slots import SlotTable
from hetero_infer.worker.runner.models.rotary import head_dim_of


@contextlib.contextmanager
def _one_thread(device: torch.device) -> Iterator[None]:
    """Small copies on the CPU in this thread alone: spread over the intra-op threads, each of hundreds of
    sub-megabyte copies waits for every thread (on a loaded machine: a second for an adapter, not milliseconds)."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass
class _HostAdapter:
    """An adapter in host memory: as read, and laid out per target as a slot holds it."""

    weights: AdapterWeights
    layout: list[tuple[torch.Tensor, torch.Tensor] | None]  # None: no weights for that target


@dataclass
class _Target:
    """One projection of one layer: its output slices (projection name, first output row, rows) and the slots'
    stacked weights."""

    slices: tuple[tuple[str, int, int], ...]
    a: torch.Tensor
    b: torch.Tensor

    def __post_init__(self) -> None:
        self.sizes = tuple(rows for _, _, rows in self.slices)
        self.filled: set[int] = set()  # the slots whose adapter has weights here (the others hold zeros)
        self.live = False  # some adapter of the step has weights here: the hook runs


def _projections(model: nn.Module, moe: bool) -> list[tuple[int, nn.Module, tuple[tuple[str, int, int], ...]]]:
    """(layer, module, slices) of every projection adapters may update."""
    config = model.config
    hd = head_dim_of(config)
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    out = []
    for i, layer in enumerate(model.layers):
        attn = layer.self_attn
        out.append((i, attn.qkv_proj, (("q_proj", 0, q), ("k_proj", q, kv), ("v_proj", q + kv, kv))))
        out.append((i, attn.o_proj, (("o_proj", 0, config.hidden_size),)))
        if not moe and hasattr(layer.mlp, "gate_up_proj"):
            inter = config.intermediate_size
            out.append((i, layer.mlp.gate_up_proj, (("gate_proj", 0, inter), ("up_proj", inter, inter))))
            out.append((i, layer.mlp.down_proj, (("down_proj", 0, config.hidden_size),)))
    return out


class LoRAModel:
    """`max_tokens`: the most tokens a step has (the CUDA slot buffer's size)."""

    def __init__(self, model: nn.Module, *, moe: bool, max_loras: int, max_rank: int, dtype: torch.dtype,
                 device: torch.device, max_tokens: int) -> None:
        self.shapes = ModelShapes.of(model.config, moe)
        self.max_rank = max_rank
        self.dtype = dtype
        self.device = device
        self.slots = SlotTable(max_loras)
        self.host: dict[str, _HostAdapter] = {}
        self.targets: list[_Target] = []
        self._index: dict[tuple[int, str], tuple[_Target, int]] = {}  # (layer, projection) -> (target, slice)
        self._hooks = []
        for layer, module, slices in _projections(model, moe):
            k = len(slices) * max_rank
            in_features = self.shapes.projections[slices[0][0]][0]
            out_features = slices[-1][1] + slices[-1][2]
            target = _Target(slices, torch.zeros(max_loras, k, in_features, dtype=dtype, device=device),
                             torch.zeros(max_loras, out_features, max_rank, dtype=dtype, device=device))
            self.targets.append(target)
            for i, (name, _, _) in enumerate(slices):
                self._index[(layer, name)] = (target, i)
            self._hooks.append(module.register_forward_hook(partial(self._hook, target)))
        self.active = False
        self._c_targets = self._c_step_targets(model)
        self._slots: torch.Tensor | None = None
        self._groups: kernels.LoRAGroups | None = None
        self._max_tokens = max_tokens
        self._slot_buffer: torch.Tensor | None = None  # the token -> slot map read on the device (static_slots)
        self._host_slots: list[torch.Tensor] = []
        self._flip = 0
        self.graph_rows = 0  # rows of the static slot buffer a captured graph reads: -1 past a step's tokens
        self.slot_loads = 0  # adapters copied into a device slot
        if device.type == "cuda":
            self.static_slots(0)

    def static_slots(self, graph_rows: int) -> None:
        """Keep the token -> slot map in a static buffer that the kernels read (on CUDA from the start; on the CPU
        for the tests of the graph path), its first `graph_rows` entries -1 past every step's tokens: what a decode
        graph of up to that many rows reads."""
        if self._slot_buffer is None:
            self._slot_buffer = torch.full((self._max_tokens,), -1, dtype=torch.int32, device=self.device)
            # the host side of its copy: two buffers (pinned on CUDA), alternating (the engine launches step N+1
            # while step N may still wait on the device for its copy; step N-1's has been made)
            pin = self.device.type == "cuda"
            self._host_slots = [torch.empty(self._max_tokens, dtype=torch.int32, pin_memory=pin) for _ in range(2)]
        if graph_rows > self._max_tokens:
            raise ValueError(f"graph_rows {graph_rows} > the slot buffer's {self._max_tokens} rows")
        self.graph_rows = max(self.graph_rows, graph_rows)

    @contextlib.contextmanager
    def graph_step(self, rows: int) -> Iterator[None]:
        """The hooks as a captured decode graph of `rows` rows runs them, whatever adapters a replay has: every
        target live (a slot's target its adapter has no weights for holds zeros: `load_slot`), the map the static
        buffer's first `rows` entries (`begin_step` writes them before a replay; slot -1 adds nothing). The step's
        own state (active, live, map) is back after."""
        if self._slot_buffer is None or rows > self.graph_rows:
            raise ValueError(f"graph_step({rows}) needs static_slots(>= {rows}) first")
        saved = self.active, self._slots, self._groups, [t.live for t in self.targets]
        self.active, self._slots, self._groups = True, self._slot_buffer[:rows], None
        for target in self.targets:
            target.live = True
        try:
            yield
        finally:
            self.active, self._slots, self._groups, live = saved
            for target, was in zip(self.targets, live):
                target.live = was

    def _c_step_targets(self, model: nn.Module) -> ctypes.Array | None:
        """The targets as the fused C decode step reads them (its b pointers set; a set per step), or None where they
        are not its layer layout (per layer: qkv, o, gate_up, down)."""
        per_layer = len(fused_step.LORA_PROJECTIONS)
        if (self.device.type != "cpu" or getattr(model, "decode_layout", None) not in fused_step.LAYOUTS
                or len(self.targets) != per_layer * len(model.layers)):
            return None
        array = (fused_step.LoraTarget * len(self.targets))()
        for entry, target in zip(array, self.targets):
            entry.b = target.b.data_ptr()
        return array

    def c_step(self) -> fused_step.StepLora | None:
        """This step's adapters for the fused C decode step (kernels/cpu/decode_step.py), or None where it cannot
        take them: the same update the hooks add, inside the C step's phases."""
        if not self.active or self._c_targets is None:
            return None
        for entry, target in zip(self._c_targets, self.targets):
            entry.a = target.a.data_ptr() if target.live else None
        return fused_step.StepLora(self._c_targets, self._slots.data_ptr(), self.max_rank)

    # -- adapters ----------------------------------------------------------------------
    def add(self, request: LoRARequest) -> None:
        """Read and check an adapter (LoRAAdapterError) into host memory, already laid out as its slot will hold
        it, so that copying it into a slot is one copy per target."""
        with _one_thread(torch.device("cpu")):
            weights = load_adapter(request, self.shapes, self.max_rank, self.dtype)
            self.host[request.lora_name] = _HostAdapter(weights, self._layout(weights))

    def remove(self, name: str) -> bool:
        self.slots.drop(name)
        return self.host.pop(name, None) is not None

    def _layout(self, weights: AdapterWeights) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """Per target, the slot's (a [K, in], b [out, R]) of `weights` (zeros where it has no module), None for a
        target it has no module of."""
        pin = self.device.type == "cuda"
        position = {id(t): i for i, t in enumerate(self.targets)}
        hit = {position[id(self._index[key][0])] for key in weights.modules}
        out = [(torch.zeros(t.a.shape[1:], dtype=self.dtype, pin_memory=pin),
                torch.zeros(t.b.shape[1:], dtype=self.dtype, pin_memory=pin)) if i in hit else None
               for i, t in enumerate(self.targets)]
        r_max = self.max_rank
        for (layer, proj), (a, b, scale) in weights.modules.items():
            target, i = self._index[(layer, proj)]
            slot_a, slot_b = out[position[id(target)]]
            _, first, rows = target.slices[i]
            r = a.shape[0]
            slot_a[i * r_max:i * r_max + r].copy_(a)
            slot_b[first:first + rows, :r].copy_(b * scale)
        return out

    @torch.inference_mode()
    def load_slot(self, slot: int, name: str) -> None:
        """Copy adapter `name` (in host memory) into device slot `slot`."""
        with _one_thread(self.device):
            for target, weights in zip(self.targets, self.host[name].layout):
                if weights is not None:
                    target.a[slot].copy_(weights[0], non_blocking=True)
                    target.b[slot].copy_(weights[1], non_blocking=True)
                    target.filled.add(slot)
                elif slot in target.filled:  # the slot's previous adapter had weights here
                    target.a[slot].zero_()
                    target.b[slot].zero_()
                    target.filled.discard(slot)
        self.slot_loads += 1

    # -- a step ------------------------------------------------------------------------
    def begin_step(self, plan: StepPlan) -> bool:
        """Make the step's adapters resident and the hooks active for it; False (nothing to do) for a step of the
        base model alone."""
        adapters = plan.adapter_ids
        self.active = False
        if not adapters:
            return False
        missing = [n for n in adapters.values() if n not in self.host]
        if missing:
            raise LoRAAdapterError(f"LoRA adapter {missing[0]!r} is not loaded")
        mapping, loads = self.slots.assign(adapters.values())
        for name, slot in loads:
            self.load_slot(slot, name)
        per_seq = np.array([mapping[adapters[s]] if s in adapters else -1 for s in plan.seq_ids], dtype=np.int32)
        self.activate(np.repeat(per_seq, [len(ids) for ids in plan.token_ids]))
        return True

    def activate(self, slots: np.ndarray) -> None:
        """The hooks (and `c_step`) active for a step whose token t runs the adapter in slot `slots[t]` (int32,
        -1: none; the adapters already in their slots)."""
        used = set(slots[slots >= 0].tolist())
        for target in self.targets:  # a projection no adapter of the step updates runs as the base model's
            target.live = not used.isdisjoint(target.filled)
        if self._slot_buffer is None:
            self._slots = torch.from_numpy(slots)
            self._groups = None  # the per-op path's grouping, made by the first hook that runs (the C step needs none)
        else:
            n, rows = len(slots), max(len(slots), self.graph_rows)
            host = self._host_slots[self._flip][:rows]
            self._flip ^= 1
            host.numpy()[:n] = slots
            host.numpy()[n:] = -1  # a graph's padding rows: no adapter
            self._slot_buffer[:rows].copy_(host, non_blocking=True)  # in stream order, before the kernels read it
            self._slots, self._groups = self._slot_buffer[:n], None
        self.active = True

    def end_step(self) -> None:
        self.active = False
        self._slots = self._groups = None

    def _hook(self, target: _Target, module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        if self.active and target.live:
            if self._groups is None and self._slot_buffer is None:
                self._groups = kernels.lora_groups(self._slots, self.slots.num_slots)
            kernels.lora_apply(args[0], output, target.a, target.b, self._slots, target.sizes, self._groups)

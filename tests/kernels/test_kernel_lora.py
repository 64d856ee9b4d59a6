"""LoRA over a batch of mixed adapters (kernels.lora_shrink / lora_expand / lora_apply): the Triton kernels (the
interpreter here), the CPU path (tokens grouped by slot, torch's grouped GEMM) and the reference, each against a
naive float64 oracle written here (a loop over tokens), on many shapes: decode- and prefill-sized steps, every
token without an adapter, every token under one, ranks and widths not multiples of the tiles."""

from __future__ import annotations

import pytest
import torch

from hetero_infer import kernels
from hetero_infer.kernels import lora as lora_mod
from hetero_infer.kernels import reference
from tests.kernels.kernel_testing import DTYPES, assert_close


def naive(x, a, b, slots, base, slices=None):
    """float64, one token and one output slice at a time: the definition."""
    out = base.double().cpu().clone()
    sizes = slices or (b.shape[1],)
    r = b.shape[2]
    for t in range(x.shape[0]):
        s = int(slots[t])
        if s >= 0:
            y = a[s].double().cpu() @ x[t].double().cpu()
            row = 0
            for i, size in enumerate(sizes):
                out[t, row:row + size] += b[s, row:row + size].double().cpu() @ y[i * r:(i + 1) * r]
                row += size
    return out


def make_case(t, n_in, r, slices, s, dtype, device, pattern="mixed", seed=0):
    g = torch.Generator().manual_seed(seed)
    n_out = sum(slices)
    x = torch.randn(t, n_in, generator=g).to(device, dtype)
    a = (torch.randn(s, len(slices) * r, n_in, generator=g) * n_in**-0.5).to(device, dtype)
    b = (torch.randn(s, n_out, r, generator=g) * r**-0.5).to(device, dtype)
    base = torch.randn(t, n_out, generator=g).to(device, dtype)
    if pattern == "none":
        slots = torch.full((t,), -1)
    elif pattern == "one":
        slots = torch.full((t,), s - 1)
    else:
        slots = torch.randint(-1, s, (t,), generator=g)
    return x, a, b, slots.to(device, torch.int32), base


# (tokens, in, rank, output slices, slots): a decode step, prefill-sized steps, widths and ranks off the tiles
# (72, 24, 40), a fused q/k/v (slices 64, 32, 32; GQA), a fused gate|up (two equal slices), one slot
SHAPES = [(1, 64, 16, (64,), 1), (7, 64, 16, (64, 16, 16), 4), (33, 72, 24, (40,), 8), (20, 128, 16, (128, 128), 3),
          (64, 64, 8, (64, 32, 32), 2), (5, 96, 5, (48, 24, 24), 3)]


def _id(shape):
    t, n_in, r, slices, s = shape
    return f"{t}x{n_in}x{r}x{'+'.join(map(str, slices))}x{s}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=_id)
@pytest.mark.parametrize("path", ["triton", "cpu", "reference"])
def test_lora_apply_matches_oracle(device, path, shape, dtype):
    if path != "triton" and device.type == "cuda":
        pytest.skip("the CPU path and the reference are checked on the CPU")
    x, a, b, slots, base = make_case(*shape, dtype, device)
    backend = {"triton": "triton", "cpu": "auto", "reference": "reference"}[path]
    out = base.clone()
    with kernels.use_backend(backend):
        groups = kernels.lora_groups(slots, a.shape[0]) if path == "cpu" else None
        kernels.lora_apply(x, out, a, b, slots, shape[3], groups)
    # the shrink's output is rounded to the dtype before the expand, the sum once more
    assert_close(out, naive(x, a, b, slots, base, shape[3]), dtype, scale=4, what=f"{path} lora_apply")


@pytest.mark.parametrize("pattern", ["none", "one", "mixed"])
@pytest.mark.parametrize("path", ["triton", "cpu", "reference"])
def test_slot_patterns(device, path, pattern):
    if path != "triton" and device.type == "cuda":
        pytest.skip("the CPU path and the reference are checked on the CPU")
    x, a, b, slots, base = make_case(17, 64, 16, (48, 16, 16), 4, torch.float32, device, pattern, seed=3)
    out = base.clone()
    with kernels.use_backend({"triton": "triton", "cpu": "auto", "reference": "reference"}[path]):
        kernels.lora_apply(x, out, a, b, slots, (48, 16, 16), kernels.lora_groups(slots, 4) if path == "cpu" else None)
    expected = naive(x, a, b, slots, base, (48, 16, 16))
    assert_close(out, expected, torch.float32, what=f"{path} {pattern}")
    if pattern == "none":
        assert torch.equal(out, base)  # tokens without an adapter are left exactly as the base layer made them


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cpu_runs_path_matches_oracle(dtype):
    """Prefill-like slots (runs of one adapter, base rows between): the CPU path run by run, as the oracle."""
    x, a, b, _, base = make_case(67, 72, 16, (40, 16, 16), 4, dtype, torch.device("cpu"), seed=7)
    slots = torch.tensor([2] * 20 + [-1] * 3 + [0] * 18 + [3] * 16 + [2] * 10, dtype=torch.int32)
    groups = kernels.lora_groups(slots, 4)
    assert groups.runs is not None
    out = base.clone()
    kernels.lora_apply(x, out, a, b, slots, (40, 16, 16), groups)
    assert_close(out, naive(x, a, b, slots, base, (40, 16, 16)), dtype, scale=4, what="cpu runs")
    assert torch.equal(out[20:23], base[20:23])


@pytest.mark.parametrize("path", ["triton", "reference"])
def test_shrink_and_expand_alone(device, path):
    x, a, b, slots, base = make_case(9, 72, 12, (24, 16), 3, torch.float32, device, seed=5)
    with kernels.use_backend(path):
        y = kernels.lora_shrink(x, a, slots)
        out = kernels.lora_expand(y, b, slots, base.clone(), (24, 16))
    for t in range(9):
        s = int(slots[t])
        want = a[s].double().cpu() @ x[t].double().cpu() if s >= 0 else torch.zeros(24, dtype=torch.float64)
        assert_close(y[t], want, torch.float32, what=f"{path} shrink row {t}")
    assert_close(out, naive(x, a, b, slots, base, (24, 16)), torch.float32, what=f"{path} expand")


def test_cpu_path_is_the_grouped_gemm(monkeypatch):
    """On the CPU `auto` with groups takes the grouped path (not the reference)."""
    x, a, b, slots, base = make_case(12, 64, 16, (64,), 4, torch.float32, "cpu")
    calls = []
    real = lora_mod.grouped_lora
    monkeypatch.setattr(lora_mod, "grouped_lora", lambda *args: calls.append(1) or real(*args))
    with kernels.use_backend("auto"):
        kernels.lora_apply(x, base.clone(), a, b, slots, None, kernels.lora_groups(slots, 4))
        kernels.lora_apply(x, base.clone(), a, b, slots)  # no groups: the reference
    assert calls == [1]


def test_groups_sort_tokens_by_slot():
    slots = torch.tensor([2, -1, 0, 2, 1, -1, 0], dtype=torch.int32)
    g = kernels.lora_groups(slots, 4)
    # slots 0..2 used (3 is not), padded to 2 rows each: [2, 6 | 4, pad | 0, 3]
    assert (g.num_slots, g.width) == (3, 2) and g.runs is None
    assert g.padding.tolist() == [3] and g.gather.tolist() == [2, 6, 4, 0, 0, 3]
    assert kernels.lora_groups(torch.full((3,), -1), 4).num_slots == 0


def test_groups_runs_of_prefill_chunks():
    """Long runs of one slot (prefill chunks, base rows between): computed run by run; short ones (decode tokens)
    grouped."""
    slots = torch.tensor([1] * 20 + [-1] * 5 + [0] * 17 + [1] * 30, dtype=torch.int32)
    g = kernels.lora_groups(slots, 4)
    assert g.runs == ((0, 20, 1), (25, 42, 0), (42, 72, 1)) and g.num_slots == 2
    assert kernels.lora_groups(torch.tensor([1, 0] * 20, dtype=torch.int32), 4).runs is None
    assert kernels.lora_groups(torch.tensor([1] * 40 + [0, 1] * 20, dtype=torch.int32), 4).runs is None


@pytest.mark.parametrize("bad, error", [
    (lambda x, a, s: (x, a.double(), s), TypeError),
    (lambda x, a, s: (x, a[:, :, :10], s), ValueError),
    (lambda x, a, s: (x, a, s[:3]), ValueError),
    (lambda x, a, s: (x, a, s.float()), TypeError),
    (lambda x, a, s: (x, a, s + 10), ValueError),
])
def test_arguments_checked(bad, error):
    x, a, _, slots, _ = make_case(5, 64, 16, (64,), 2, torch.float32, "cpu")
    with pytest.raises(error):
        kernels.lora_shrink(*bad(x, a, slots))


def test_expand_slices_checked():
    x, a, b, slots, base = make_case(5, 64, 8, (32, 16, 16), 2, torch.float32, "cpu")
    y = kernels.lora_shrink(x, a, slots)
    for bad in [(32, 32), (32, 16), (16, 16, 16, 16)]:
        with pytest.raises(ValueError, match="slices"):
            kernels.lora_expand(y, b, slots, base.clone(), bad)


def test_reference_is_the_oracle_in_float64():
    x, a, b, slots, base = make_case(11, 40, 8, (12, 6, 6), 3, torch.float64, "cpu", seed=7)
    out = reference.lora_expand(reference.lora_shrink(x, a, slots), b, slots, base.clone(), (12, 6, 6))
    torch.testing.assert_close(out, naive(x, a, b, slots, base, (12, 6, 6)), rtol=1e-12, atol=1e-12)

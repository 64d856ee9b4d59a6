"""QuantizedLinear and quantize_model against float matmuls with the dequantized weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from quant_testing import tiny_config
from torch import nn

from hetero_infer import kernels
from hetero_infer.worker.quant.quantize import QuantizedLinear, int4_group_size, quantize_model, weight_bytes
from hetero_infer.worker.runner.attention import StepBatch, TorchBackend
from hetero_infer.worker.runner.loader import model_family
from hetero_infer.worker.runner.models.decoder import DecoderForCausalLM

TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2e-2, 2e-2)}


def linear(k: int, n: int, bias: bool, dtype: torch.dtype, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    layer = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        layer.weight.normal_(0, 0.05)
        layer.weight[3, 7] = 0.9  # an outlier in one channel / group
        if bias:
            layer.bias.normal_(0, 0.1)
    return layer.to(dtype)


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_forward_is_the_dequantized_matmul(method, dtype, bias):
    dense = linear(256, 96, bias, dtype)
    q = QuantizedLinear.from_linear(dense, method)
    x = torch.randn(2, 5, 256).to(dtype)  # leading dims are kept
    y = q(x)
    assert y.shape == (2, 5, 96) and y.dtype == dtype
    w = q.dequantized_weight(torch.float32)
    expected = F.linear(x.float(), w, None if dense.bias is None else dense.bias.float())
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(y.float(), expected, atol=atol, rtol=rtol)
    # and the quantized weight approximates the dense one: INT8 within half a step everywhere; INT4 (clip search:
    # clipped values may be off by more) with no more squared error per group than min/max rounding
    err = w - dense.weight.float()
    if method == "int8":
        assert bool((err.abs() <= q.scales[:, None] / 2 * 1.001 + 1e-6).all())
    else:
        minmax = kernels.dequantize_int4(*kernels.quantize_int4(dense.weight, q.group_size), q.group_size)
        per_group = err.square().reshape(96, -1, q.group_size).sum(-1)
        minmax_per_group = (minmax - dense.weight.float()).square().reshape(96, -1, q.group_size).sum(-1)
        assert bool((per_group <= minmax_per_group * (1 + 1e-5) + 1e-12).all())


def test_buffers_hold_the_kernel_formats():
    dense = linear(256, 64, False, torch.float32)
    q8 = QuantizedLinear.from_linear(dense, "int8")
    assert (q8.qweight.dtype, tuple(q8.qweight.shape), tuple(q8.scales.shape)) == (torch.int8, (64, 256), (64,))
    ref_q, ref_s = kernels.quantize_int8(dense.weight)
    assert torch.equal(q8.qweight, ref_q) and torch.equal(q8.scales, ref_s)
    q4 = QuantizedLinear.from_linear(dense, "int4")
    assert q4.group_size == 128 and q4.qweight.dtype == torch.uint8
    assert tuple(q4.qweight.shape) == (64, 128) and tuple(q4.scales.shape) == tuple(q4.zeros.shape) == (64, 2)


def test_int4_group_falls_back_to_a_divisor_of_k():
    assert int4_group_size(1536) == 128
    assert int4_group_size(576) == 64  # SmolLM2's hidden size
    assert int4_group_size(96) == 32
    with pytest.raises(ValueError, match="divisible"):
        int4_group_size(48)
    q = QuantizedLinear.from_linear(linear(576, 16, False, torch.float32), "int4")
    assert q.group_size == 64 and tuple(q.scales.shape) == (16, 9)


def test_unknown_method_is_rejected():
    with pytest.raises(ValueError, match="int8"):
        QuantizedLinear.from_linear(linear(64, 8, False, torch.float32), "fp8")
    with pytest.raises(ValueError, match="int8"):
        quantize_model(nn.Sequential(), "int2")


def _model(arch: str, dtype: torch.dtype) -> DecoderForCausalLM:
    torch.manual_seed(0)
    config = tiny_config(arch)
    model = model_family(config).model_class(config, max_positions=64)
    for p in model.parameters():
        nn.init.normal_(p, 0, 0.1)
    return model.to(dtype).eval()


def _prefill(model: DecoderForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    cfg = model.config
    t = ids.shape[0]
    dtype = model.embed_tokens.weight.dtype
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = torch.zeros(2, 1, t, cfg.num_key_value_heads, head_dim, dtype=dtype)
    backend = TorchBackend(model.rotary_embedding(dtype, "cpu"), "cpu")
    meta = backend.prepare(StepBatch.fresh_prompts([t], block_size=t))
    with torch.inference_mode():
        return model.compute_logits(model(ids, backend, meta, [(kv[0], kv[1])] * len(model.layers)))


@pytest.mark.parametrize("calibrated", [False, True], ids=["rtn", "gptq"])
@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # untied lm_head; qkv bias + tied embeddings
def test_quantize_model_replaces_projections_only(arch, method, calibrated):
    model = _model(arch, torch.float32)
    ids = torch.randint(0, 49152, (9,))
    before = weight_bytes(model)
    calibration = [torch.randint(0, 49152, (n,)).tolist() for n in (40, 7, 25)] if calibrated else "auto"
    report = quantize_model(model, method, calibration=calibration)  # "auto": no tokenizer folder, round to nearest
    cfg = model.config
    layers = cfg.num_hidden_layers
    assert report.num_quantized == 4 * layers and report.bytes_before == before
    assert report.calibration_tokens == (72 if calibrated else 0)
    for layer in model.layers:
        for proj in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            assert isinstance(proj, QuantizedLinear) and proj.method == method
    assert type(model.embed_tokens) is nn.Embedding and model.embed_tokens.weight.dtype == torch.float32
    if arch == "llama":
        assert type(model.lm_head) is nn.Linear
    assert model.norm.weight.dtype == torch.float32
    # bytes: exact accounting of what was replaced
    h, i = cfg.hidden_size, cfg.intermediate_size
    shapes = [(h + 2 * (h // 2), h), (h, h), (2 * i, h), (h, i)]  # [N, K]: 4 heads, 2 KV heads
    per_layer_float = sum(n * k for n, k in shapes) * 4
    if method == "int8":
        per_layer_quant = sum(n * k + 4 * n for n, k in shapes)
    else:
        per_layer_quant = sum(n * k // 2 + 5 * n * k // 128 for n, k in shapes)
    assert report.bytes_after == before - layers * (per_layer_float - per_layer_quant)
    assert report.bytes_after == weight_bytes(model)

    # the quantized model is the float model with dequantized weights
    dense = _model(arch, torch.float32)
    with torch.no_grad():
        for qlayer, dlayer in zip(model.layers, dense.layers):
            for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
                dlayer.get_submodule(name).weight.copy_(qlayer.get_submodule(name).dequantized_weight())
    torch.testing.assert_close(_prefill(model, ids), _prefill(dense, ids), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(_prefill(model, ids), _prefill(_model(arch, torch.float32), ids), atol=1e-3)


def test_gptq_model_is_closer_to_the_float_model_on_its_calibration_text():
    """Sequential GPTQ lowers the error of the whole model's logits on the calibration tokens vs round to nearest."""
    calibration = [torch.randint(0, 49152, (n,), generator=torch.Generator().manual_seed(n)).tolist()
                   for n in (60, 50, 40)]
    ids = torch.tensor([t for seq in calibration[:1] for t in seq])
    dense = _prefill(_model("llama", torch.float32), ids)
    errors = {}
    for name, calib in (("rtn", None), ("gptq", calibration)):
        model = _model("llama", torch.float32)
        quantize_model(model, "int4", calibration=calib)
        errors[name] = float((_prefill(model, ids) - dense).square().mean())
    assert errors["gptq"] < 0.8 * errors["rtn"]


def test_bfloat16_model_keeps_its_dtype_outside_the_projections():
    model = _model("llama", torch.bfloat16)
    quantize_model(model, "int8")
    assert model.embed_tokens.weight.dtype == model.lm_head.weight.dtype == torch.bfloat16
    assert model.layers[0].self_attn.qkv_proj.scales.dtype == torch.float32
    logits = _prefill(model, torch.randint(0, 49152, (5,)))
    assert logits.dtype == torch.bfloat16 and bool(torch.isfinite(logits).all())


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("arch", ["qwen3-moe", "mixtral", "qwen2-moe"])
def test_quantize_model_quantizes_every_expert(arch, method):
    """The experts become QuantizedExperts (the routers stay float), the other projections QuantizedLinear; the
    model computes what the float model with the dequantized weights computes."""
    from hetero_infer.worker.quant.experts import QuantizedExperts
    from hetero_infer.worker.runner.models.moe import Experts

    model = _model(arch, torch.float32)
    before = weight_bytes(model)
    report = quantize_model(model, method, calibration=[list(range(100, 140))])
    layers = model.config.num_hidden_layers
    shared = model.layers[0].mlp.shared_expert is not None  # its gate_up and down are Linears: quantized as such
    # qkv, o, two expert stacks (and the shared expert's two Linears)
    assert report.num_quantized == (6 if shared else 4) * layers and report.calibration_tokens == 40
    for layer in model.layers:
        assert isinstance(layer.mlp.experts, QuantizedExperts) and layer.mlp.experts.method == method
        assert type(layer.mlp.gate) is nn.Linear and layer.mlp.gate.weight.dtype == torch.float32
    e, h = model.layers[0].mlp.experts.num_experts, model.config.hidden_size
    i = getattr(model.config, "moe_intermediate_size", None) or model.config.intermediate_size
    assert report.bytes_after == weight_bytes(model) and report.bytes_after < before - layers * e * 3 * h * i * 2

    dense = _model(arch, torch.float32)
    with torch.no_grad():
        for qlayer, dlayer in zip(model.layers, dense.layers):
            for name in ("qkv_proj", "o_proj"):
                getattr(dlayer.self_attn, name).weight.copy_(getattr(qlayer.self_attn, name).dequantized_weight())
            if shared:
                for name in ("gate_up_proj", "down_proj"):
                    q = getattr(qlayer.mlp.shared_expert, name)
                    assert isinstance(q, QuantizedLinear)
                    getattr(dlayer.mlp.shared_expert, name).weight.copy_(q.dequantized_weight())
            gate_up, down = qlayer.mlp.experts.weights()
            assert isinstance(dlayer.mlp.experts, Experts)
            dlayer.mlp.experts.gate_up_proj.copy_(gate_up.dequantized())
            dlayer.mlp.experts.down_proj.copy_(down.dequantized())
    ids = torch.randint(0, 49152, (9,))
    torch.testing.assert_close(_prefill(model, ids), _prefill(dense, ids), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(_prefill(model, ids), _prefill(_model(arch, torch.float32), ids), atol=1e-3)

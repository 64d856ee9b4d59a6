"""Each tensor-parallel layer against its unsharded reference, on the CPU with gloo: world sizes 2 (and 4: slow), spawned
processes (one per rank, as the engine runs them). Every rank builds the whole model (the reference) and its
shard from the same weights, and compares: the vocabulary-parallel embedding, attention with its heads split (KV
heads split, or replicated where a config has fewer than the ranks), the column|row-parallel MLP, the MoE block with
every expert's intermediate dimension split, whole decoder layers, the gathered logits; and INT8 / INT4 shards
(quantized after sharding) against the quantized whole model."""

from __future__ import annotations

import datetime
import traceback

import pytest
import torch
import torch.multiprocessing as mp

VOCAB = 1001  # not a multiple of 2 or 4: the last vocabulary slice is padded


def _config(arch: str):
    from transformers import LlamaConfig, Qwen2MoeConfig, Qwen3MoeConfig

    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, initializer_range=0.15,
                tie_word_embeddings=False)
    if arch == "llama":  # biases on q/k/v/o: o's bias added once over the ranks
        return LlamaConfig(attention_bias=True, **base)
    if arch == "qwen3_moe":
        return Qwen3MoeConfig(head_dim=16, use_sliding_window=False, num_experts=8, num_experts_per_tok=2,
                              norm_topk_prob=True, moe_intermediate_size=64, **base)
    # one KV head: replicated on every rank; tied embeddings; a shared expert beside the routed ones
    return Qwen2MoeConfig(use_sliding_window=False, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          shared_expert_intermediate_size=48,
                          **{**base, "num_key_value_heads": 1, "tie_word_embeddings": True})


def _build(config, tp):
    from hetero_infer.worker.runner.dummy_weights import dummy_weights
    from hetero_infer.worker.runner.loader import model_family
    from hetero_infer.worker.runner.parallel import group

    with group.building(tp or group.SINGLE):
        model = model_family(config).model_class(config, max_positions=64)
    model.family = model_family(config)
    with torch.no_grad():  # nonzero biases: their split is checked too
        named = [(n, t + 0.05 if n.endswith("bias") else t) for n, t in dummy_weights(config, "cpu", torch.float32)]
        model.load_weights(named)
    return model.eval()


def _step(model, lengths):
    from hetero_infer.worker.runner.attention import StepBatch, TorchBackend

    batch = StepBatch.fresh_prompts(lengths, block_size=4)
    backend = TorchBackend(model.rotary_embedding(torch.float32, "cpu"), "cpu")
    meta = backend.prepare(batch)
    from hetero_infer.worker.runner.models.rotary import head_dim_of

    kv = torch.zeros(len(model.layers), 2, batch.num_blocks, 4, model.num_kv_heads, head_dim_of(model.config))
    return backend, meta, [(kv[i, 0], kv[i, 1]) for i in range(len(model.layers))]


def _close(a: torch.Tensor, b: torch.Tensor, what: str, tol: float = 1e-5) -> None:
    err = (a - b).abs().max().item()
    scale = b.abs().max().item()
    assert err <= tol * max(1.0, scale), f"{what}: max error {err:.3g} (scale {scale:.3g})"


def _rank(rank: int, world: int, path: str, errors) -> None:
    try:
        import torch.distributed as dist

        from hetero_infer import kernels
        from hetero_infer.worker.quant.quantize import quantize_model
        from hetero_infer.worker.runner.parallel.checks import check_split
        from hetero_infer.worker.runner.parallel.group import TensorParallel

        torch.set_num_threads(1)
        store = dist.FileStore(path, world)
        tp = TensorParallel(rank, world, dist.ProcessGroupGloo(store, rank, world, datetime.timedelta(seconds=60)))
        for arch in ("llama", "qwen3_moe", "qwen2_moe"):
            config = _config(arch)
            full, part = _build(config, None), _build(config, tp)
            ids = torch.tensor([3, 500, 1000, 999, 7, 250, 751, 0])  # ids in every rank's vocabulary slice
            lengths = [5, 3]
            with torch.inference_mode():
                _close(part._embed_parallel(ids), full.embed_tokens(ids), f"{arch} embedding")
                fb, fm, fkv = _step(full, lengths)
                pb, pm, pkv = _step(part, lengths)
                x = torch.randn(len(ids), config.hidden_size, generator=torch.Generator().manual_seed(5))
                for i, (fl, pl) in enumerate(zip(full.layers, part.layers)):
                    h = fl.input_layernorm(x, fb)
                    _close(tp.all_reduce(pl.self_attn(h, pb, pm, pkv[i])), fl.self_attn(h, fb, fm, fkv[i]),
                           f"{arch} layer {i} attention")
                    _close(tp.all_reduce(pl.mlp(h, pb)), fl.mlp(h, fb), f"{arch} layer {i} {type(fl.mlp).__name__}")
                    _close(pl(x, x, pb, pm, pkv[i])[0], fl(x, x, fb, fm, fkv[i])[0], f"{arch} decoder layer {i}")
                fb, fm, fkv = _step(full, lengths)
                pb, pm, pkv = _step(part, lengths)
                hidden_full, hidden_part = full(ids, fb, fm, fkv), part(ids, pb, pm, pkv)
                _close(hidden_part, hidden_full, f"{arch} hidden states")
                logits = part.compute_logits(hidden_part)
                assert logits.shape == (len(ids), VOCAB)
                _close(logits, full.compute_logits(hidden_full), f"{arch} logits")
            if arch == "qwen2_moe":
                continue
            for method, tol in (("int8", 0.05), ("int4", 0.25)):  # quantized after sharding, scales per shard
                if method == "int4" and world == 4:  # a rank's o_proj input is 16 wide: less than one INT4 group
                    with pytest.raises(ValueError, match="INT4 groups of 32 do not divide a rank's part of "
                                                         "num_attention_heads x head_dim"):
                        check_split(config.to_dict(), world, min(kernels.INT4_GROUP_SIZES))
                    continue
                check_split(config.to_dict(), world, min(kernels.INT4_GROUP_SIZES) if method == "int4" else None)
                qfull, qpart = _build(config, None), _build(config, tp)
                quantize_model(qfull, method, calibration=None)
                quantize_model(qpart, method, calibration=None)
                with torch.inference_mode():  # each layer's attention and MLP on the same input
                    fb, fm, fkv = _step(qfull, lengths)
                    pb, pm, pkv = _step(qpart, lengths)
                    _, em, ekv = _step(full, lengths)
                    for i, (fl, pl, el) in enumerate(zip(qfull.layers, qpart.layers, full.layers)):
                        h = fl.input_layernorm(x, fb)
                        for what, ref, got, exact in (
                                ("attention", fl.self_attn(h, fb, fm, fkv[i]),
                                 tp.all_reduce(pl.self_attn(h, pb, pm, pkv[i])), el.self_attn(h, fb, em, ekv[i])),
                                ("mlp", fl.mlp(h, fb), tp.all_reduce(pl.mlp(h, pb)), el.mlp(h, fb))):
                            where = f"{arch} {method} layer {i} {what}"
                            _close(got, ref, where, tol)
                            # a shard's own scales are no worse than the whole row's: as close to float32
                            assert (got - exact).abs().mean() <= 1.5 * (ref - exact).abs().mean() + 1e-6, where
    except BaseException:
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        raise


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_parallel_layers_match_their_unsharded_reference(tmp_path, world):
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    mp.start_processes(_rank, args=(world, str(tmp_path / "store"), errors), nprocs=world, start_method="spawn",
                       join=True)
    assert errors.empty(), errors.get()

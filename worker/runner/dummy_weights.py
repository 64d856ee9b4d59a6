"""Random weights from a model's config alone (`load_format="dummy"`, as in vLLM): any model shape can be run,
benchmarked and tested on a machine without its checkpoint or a network.

The tensors carry the checkpoint's (Hugging Face) names and shapes, read from transformers' own model of the
config built on the meta device (no memory), so they load through the same `load_weights` as a checkpoint, and
the same seed gives a transformers model of the config the same weights (`fill_hf_model`): the peer of the
benchmarks and the reference of the tests. Each tensor is made on the target device in the target dtype, one at
a time: an 8B model in bfloat16 is 16 GB, never float32 and never on the CPU first.

Values: norm weights 1, biases 0, every other weight uniform in [-a, a] with a = sqrt(3) * initializer_range
(the standard deviation transformers initialises with; 0.02 by default). vLLM's dummy weights are uniform in
[-1e-3, 1e-3] everywhere, norms included: then all logits lie within a hair of each other and greedy decoding is
decided by rounding noise, so two implementations of the same model could not be compared on them.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator

import torch

DEFAULT_INITIALIZER_RANGE = 0.02


def hf_parameter_shapes(hf_config) -> list[tuple[str, torch.Size]]:
    """(name, shape) of every parameter of transformers' model of `hf_config` (tied ones once), in its order."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    return [(name, p.shape) for name, p in model.named_parameters()]


def dummy_tensor(name: str, shape: torch.Size, hf_config, device: torch.device | str, dtype: torch.dtype,
                 seed: int) -> torch.Tensor:
    """The dummy value of parameter `name`: the same for the same (name, shape, config, device, dtype, seed)."""
    out = torch.empty(shape, dtype=dtype, device=device)
    leaf = name.rsplit(".", 2)
    if leaf[-1] == "bias":
        return out.zero_()
    if len(shape) == 1 and "norm" in leaf[-2]:
        return out.fill_(1.0)
    std = getattr(hf_config, "initializer_range", None) or DEFAULT_INITIALIZER_RANGE
    bound = math.sqrt(3.0) * std
    generator = torch.Generator(device=out.device).manual_seed(_tensor_seed(seed, name))
    return out.uniform_(-bound, bound, generator=generator)


def dummy_weights(hf_config, device: torch.device | str, dtype: torch.dtype,
                  seed: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) for every parameter of the config's model, made one at a time."""
    for name, shape in hf_parameter_shapes(hf_config):
        yield name, dummy_tensor(name, shape, hf_config, device, dtype, seed)


def fill_hf_model(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Overwrite the parameters of a transformers model with the dummy weights of its config (on its device, in
    each parameter's dtype): the weights an engine with `load_format="dummy"` and the same seed has."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(dummy_tensor(name, param.shape, model.config, param.device, param.dtype, seed))
    return model


def _tensor_seed(seed: int, name: str) -> int:
    """One generator seed per tensor, so a tensor's values depend on its name, not on the order of loading."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "quant"))  # quant_testing: the tiny models

from lora_testing import ALL_LINEAR, save_adapter  # noqa: E402
from quant_testing import tiny_model_factory  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Factory: arch -> (folder, float32 HF model)."""
    return tiny_model_factory(tmp_path_factory, "lora")


# The adapters the tests run: two ranks, different target sets, both PEFT scalings.
ADAPTERS = {
    "attn8": dict(r=8, targets=["q_proj", "v_proj"], alpha=16.0, seed=1),
    "all16": dict(r=16, targets=ALL_LINEAR, alpha=8.0, seed=2),
    "mlp8rs": dict(r=8, targets=["k_proj", "o_proj", "gate_proj", "down_proj"], alpha=4.0, rslora=True, seed=3),
}


@pytest.fixture(scope="session")
def adapter(tmp_path_factory, tiny_model):
    """Factory: (arch, adapter name) -> its PEFT folder, made once."""
    cache = {}

    def make(arch: str, name: str, **overrides):
        key = (arch, name, repr(sorted(overrides.items())))
        if key not in cache:
            _, base = tiny_model(arch)
            folder = tmp_path_factory.mktemp(f"adapter-{arch}-{name}")
            cache[key] = save_adapter(base, folder, **{**ADAPTERS.get(name, {}), **overrides})
        return cache[key]

    return make

from __future__ import annotations

import pytest
from quant_testing import save_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Factory: arch -> (folder, float32 HF model); random weights, the default tokenizer."""
    cache = {}

    def make(arch: str):
        if arch not in cache:
            folder = tmp_path_factory.mktemp(f"quant-model-{arch}")
            cache[arch] = (folder, save_tiny_model(arch, folder))
        return cache[arch]

    return make

from __future__ import annotations

import pytest
from quant_testing import tiny_model_factory


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Factory: arch -> (folder, float32 HF model); random weights, the default tokenizer."""
    return tiny_model_factory(tmp_path_factory, "quant")

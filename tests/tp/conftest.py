"""The engine tests' tiny random-weight models (tests/engine/conftest.py), shared here."""

from tests.engine.conftest import tiny_model, tokenizer_dir  # noqa: F401

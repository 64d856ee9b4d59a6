"""Log lines for a Python user of `LLM`: as vLLM does (VLLM_CONFIGURE_LOGGING), the library's INFO records (each
start-up phase with its time: model resolved, weights loaded, kernels chosen) reach stderr when the program has
configured no logging of its own. A program that has (or HETERO_INFER_CONFIGURE_LOGGING=0) is left alone."""

from __future__ import annotations

import logging
import os
import sys

_LOGGER = "hetero_infer"
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_default_logging() -> bool:
    """Give the `hetero_infer` logger a stderr handler at INFO if nothing would show its records; True if it did."""
    if os.environ.get("HETERO_INFER_CONFIGURE_LOGGING", "1") == "0":
        return False
    logger = logging.getLogger(_LOGGER)
    if logger.handlers or logging.getLogger().handlers:
        return False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    return True

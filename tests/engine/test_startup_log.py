"""A Python user of `LLM` sees each start-up phase with its time on stderr (as vLLM prints its own), unless the
program configured logging itself or turned it off (HETERO_INFER_CONFIGURE_LOGGING=0)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_MAKE = "from hetero_infer import LLM; LLM(executor='mock', max_model_len=256)"


def _stderr(code: str, **env: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def test_llm_prints_its_start_up_phases() -> None:
    err = _stderr(_MAKE)
    for phase in ("config and tokenizer loaded (", "engine ready in "):
        assert phase in err, err


@pytest.mark.parametrize("code, env", [
    (_MAKE, {"HETERO_INFER_CONFIGURE_LOGGING": "0"}),
    ("import logging; logging.basicConfig(level=logging.WARNING); " + _MAKE, {}),
])
def test_a_program_that_chose_its_logging_is_left_alone(code: str, env: dict[str, str]) -> None:
    assert "engine ready in" not in _stderr(code, **env)

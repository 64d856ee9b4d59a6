"""Puts this folder on sys.path (pytest's default import mode adds a conftest's folder): the test folders share
`cli_process.py` (tests/server/server_proc.py and tests/router/router_proc.py build on it)."""

import os
import sys

import pytest

# `LLM` runs its engine in this process in the tests (they look inside it: `llm.engine`; and a process per LLM would
# add seconds to each): tests/engine/test_llm_process.py covers the default, the engine in its own process.
os.environ.setdefault("HETERO_INFER_LLM_ENGINE_PROCESS", "0")


@pytest.fixture(autouse=True)
def _kernel_backend_unchanged():
    """A test that forces the kernels' backend (`kernels.set_backend`) and leaves it so would run every later test
    of the process through Triton's interpreter (minutes per model forward): fail the test that leaked it."""
    backend = sys.modules.get("hetero_infer.kernels._backend")
    # not imported yet: it will start from the environment's choice
    before = backend.get_backend() if backend else (os.environ.get("HETERO_INFER_KERNELS") or "auto").strip().lower()
    yield
    backend = sys.modules.get("hetero_infer.kernels._backend")
    if backend is not None and backend.get_backend() != before:
        leaked = backend.get_backend()
        backend.set_backend(before)
        pytest.fail(f"the test left the kernels' backend at {leaked!r} (was {before!r}): use kernels.use_backend")


@pytest.fixture(autouse=True)
def _project_environment_unchanged():
    """A test that sets a HETERO_INFER_* variable and leaves it (os.environ written directly, or monkeypatch.delenv
    of an absent variable followed by code that sets it) changes every later test of the process: fail it."""
    before = {k: v for k, v in os.environ.items() if k.startswith("HETERO_INFER_")}
    yield
    after = {k: v for k, v in os.environ.items() if k.startswith("HETERO_INFER_")}
    if after != before:
        for k in after.keys() - before.keys():
            del os.environ[k]
        os.environ.update(before)
        changed = sorted(k for k in after.keys() | before.keys() if after.get(k) != before.get(k))
        pytest.fail(f"the test left the environment changed: {', '.join(changed)} (use monkeypatch.setenv)")


# What a start-up test means by the model's config classes: the Llama family's modules, and torch's
# distributed-tensor module, which transformers imports with them.
_MODEL_CONFIG_MODULES = "m.startswith('transformers.models.llama') or m == 'torch.distributed.tensor'"


def _config_modules_after(code: str) -> tuple[set[str], str]:
    """(the `_MODEL_CONFIG_MODULES` imported, what else it printed) once `code` has run in a fresh process."""
    import ast
    import subprocess

    code += f"\nprint(sorted(m for m in sys.modules if {_MODEL_CONFIG_MODULES}))\n"
    out = subprocess.run([sys.executable, "-c", "import sys\n" + code], capture_output=True, text=True,
                         timeout=180, check=True)
    *printed, modules = out.stdout.strip().splitlines()
    return set(ast.literal_eval(modules)), "\n".join(printed)


@pytest.fixture(scope="session")
def model_config_imports(tmp_path_factory: pytest.TempPathFactory):
    """Function: code -> (the model config modules it imports beyond transformers' own, what it printed).
    Transformers' own: those `AutoTokenizer` imports for a folder holding only the default model's tokenizer
    files (none with transformers 5.24; with 5.17 `torch.distributed.tensor` and Llama 4's image processor,
    whatever the folder)."""
    import shutil

    from hetero_infer.worker.runner.loader import resolve_model

    folder = tmp_path_factory.mktemp("tokenizer-only")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(resolve_model(None)[0] / name, folder / name)
    own, _ = _config_modules_after(f"from transformers import AutoTokenizer\nAutoTokenizer.from_pretrained({str(folder)!r})")

    def beyond_transformers(code: str) -> tuple[set[str], str]:
        modules, printed = _config_modules_after(code)
        return modules - own, printed

    return beyond_transformers

"""Old import names of modules that moved, answered with the module itself (the same object, so private names,
monkeypatching and isinstance all behave as before).

The shared contracts moved out of the worker into `hetero_infer.contracts` (docs/contracts.md) so that the
router and the operator import no worker module. The files were renamed, not copied, and nothing was left at
the old paths: work in progress that edits the old files follows the rename when it is rebased, and code that
still imports the old names keeps working through this table. New code imports the new names.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

MOVED = {
    "hetero_infer.options": "hetero_infer.contracts.options",
    "hetero_infer.block_hashes": "hetero_infer.contracts.block_hashes",
    "hetero_infer.worker.config": "hetero_infer.contracts.engine_options",
    "hetero_infer.worker.tokenizer": "hetero_infer.contracts.tokenizer",
    "hetero_infer.worker.server.cors": "hetero_infer.contracts.cors",
    "hetero_infer.worker.server.protocol": "hetero_infer.contracts.protocol",
    "hetero_infer.worker.server.options": "hetero_infer.contracts.server_options",
    "hetero_infer.worker.server.tools.prompt": "hetero_infer.contracts.chat_prompt",
    "hetero_infer.router.options": "hetero_infer.contracts.router_options",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(name, self) if name in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(MOVED[spec.name])
        self._specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # Already executed under its new name; the import system set the alias's spec on it: put its own back.
        module.__spec__ = self._specs[module.__name__]


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())

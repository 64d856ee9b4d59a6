"""The operator suite's fixtures for other suites (autoscale, router): its conftest loaded once, under its own
module name, so every suite uses one definition. Put tests/operator on sys.path, then
`from borrowed_fixtures import operator_fixtures`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

NAME = "operator_tests_conftest"


def operator_fixtures() -> ModuleType:
    if NAME in sys.modules:
        return sys.modules[NAME]
    spec = importlib.util.spec_from_file_location(NAME, Path(__file__).with_name("conftest.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = module
    spec.loader.exec_module(module)
    return module

"""Every module of the package imports under the running interpreter, and none needs more than Python 3.10 (the
floor in pyproject.toml): no syntax newer than 3.10, no unguarded import or use of what the standard library
gained in 3.11 or later (tomllib, asyncio.TaskGroup, typing.Self, ...).

The package is read from pyproject.toml (`packages` and `package-dir`), so a new folder that is not listed
there (and so would be left out of a wheel) fails here instead of being skipped.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLOOR = (3, 10)

# Standard-library modules and names added after Python 3.10 (the ones this code base could plausibly reach for).
NEW_MODULES = {"tomllib": "3.11", "wsgiref.types": "3.11"}
NEW_NAMES = {
    "typing": {"Self": "3.11", "LiteralString": "3.11", "Never": "3.11", "assert_never": "3.11",
               "assert_type": "3.11", "reveal_type": "3.11", "Required": "3.11", "NotRequired": "3.11",
               "TypeVarTuple": "3.11", "Unpack": "3.11", "dataclass_transform": "3.11", "get_overloads": "3.11",
               "clear_overloads": "3.11", "override": "3.12", "TypeAliasType": "3.12", "ReadOnly": "3.13",
               "TypeIs": "3.13"},
    "enum": {"StrEnum": "3.11", "ReprEnum": "3.11", "verify": "3.11", "EnumCheck": "3.11",
             "FlagBoundary": "3.11", "global_enum": "3.11", "member": "3.11", "nonmember": "3.11"},
    "asyncio": {"TaskGroup": "3.11", "timeout": "3.11", "timeout_at": "3.11", "Timeout": "3.11", "Runner": "3.11",
                "Barrier": "3.11", "BrokenBarrierError": "3.11", "eager_task_factory": "3.12",
                "QueueShutDown": "3.13"},
    "contextlib": {"chdir": "3.11"},
    "datetime": {"UTC": "3.11"},
    "hashlib": {"file_digest": "3.11"},
    "operator": {"call": "3.11"},
    "itertools": {"batched": "3.12"},
    "math": {"cbrt": "3.11", "exp2": "3.11", "sumprod": "3.12"},
    "inspect": {"getmembers_static": "3.11", "markcoroutinefunction": "3.12"},
    "logging": {"getLevelNamesMapping": "3.11", "getHandlerByName": "3.12"},
    "re": {"NOFLAG": "3.11"},
    "sys": {"exception": "3.11", "monitoring": "3.12"},
}
NEW_BUILTINS = {"ExceptionGroup": "3.11", "BaseExceptionGroup": "3.11"}
GUARD_EXCEPTIONS = {"ImportError", "ModuleNotFoundError", "AttributeError", "NameError", "Exception"}


def _guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside `try: ... except ImportError` (or a broader handler) or under `if sys.version_info ...`."""
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.Try) and child in parent.body:
            for handler in parent.handlers:
                caught = handler.type
                names = {n.id for n in ast.walk(caught) if isinstance(n, ast.Name)} if caught else {"Exception"}
                if names & GUARD_EXCEPTIONS:
                    return True
        if isinstance(parent, ast.If) and any(
                isinstance(n, ast.Attribute) and n.attr == "version_info" for n in ast.walk(parent.test)):
            return True
        child, parent = parent, parents.get(parent)
    return False


def python_3_10_problems(source: str, filename: str = "<source>") -> list[str]:
    """What in `source` needs a Python newer than 3.10: newer syntax, or an unguarded import or attribute use of
    a newer standard-library module or name."""
    try:
        tree = ast.parse(source, filename, feature_version=FLOOR)
    except SyntaxError as exc:
        return [f"{filename}:{exc.lineno}: syntax newer than Python 3.10 ({exc.msg})"]
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    module_aliases: dict[str, str] = {}  # local name -> standard-library module it is bound to
    problems = []

    def report(node: ast.AST, what: str, version: str) -> None:
        if not _guarded(node, parents):
            problems.append(f"{filename}:{node.lineno}: {what} is new in Python {version}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in NEW_MODULES:
                    report(node, f"import {alias.name}", NEW_MODULES[alias.name])
                if alias.name in NEW_NAMES:
                    module_aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if node.module in NEW_MODULES or full in NEW_MODULES:
                    report(node, f"from {node.module} import {alias.name}",
                           NEW_MODULES.get(node.module) or NEW_MODULES[full])
                elif alias.name in NEW_NAMES.get(node.module, {}):
                    report(node, f"from {node.module} import {alias.name}", NEW_NAMES[node.module][alias.name])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = module_aliases.get(node.value.id)
            if module and node.attr in NEW_NAMES[module]:
                report(node, f"{module}.{node.attr}", NEW_NAMES[module][node.attr])
        elif isinstance(node, ast.Name) and node.id in NEW_BUILTINS and isinstance(node.ctx, ast.Load):
            report(node, node.id, NEW_BUILTINS[node.id])
    return problems


# -- the package, as pyproject.toml ships it --------------------------------------------------------------
def _pyproject() -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib  # the dev extra installs it on 3.10
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def package_folders() -> dict[str, Path]:
    """Each package of pyproject's `packages`, by its folder (following `package-dir`)."""
    setuptools = _pyproject()["tool"]["setuptools"]
    mapping = setuptools.get("package-dir", {})
    out = {}
    for package in setuptools["packages"]:
        prefix = max((p for p in mapping if package == p or package.startswith(p + ".")), key=len, default="")
        rest = package[len(prefix):].lstrip(".").split(".") if prefix else package.split(".")
        out[package] = ROOT.joinpath(mapping.get(prefix, ""), *[r for r in rest if r])
    return out


def package_modules() -> list[str]:
    names = []
    for package, folder in package_folders().items():
        names.append(package)
        names += [f"{package}.{f.stem}" for f in sorted(folder.glob("*.py")) if f.name != "__init__.py"]
    return sorted(names)


def test_every_package_folder_is_listed_in_pyproject() -> None:
    """(A listed folder may lack __init__.py: operator/ does on purpose, see hetero_infer/__init__.py.)"""
    folders = package_folders()
    for package, folder in folders.items():
        assert folder.is_dir(), f"{package}: no folder {folder}"
    listed = set(folders.values())
    for folder in list(listed):
        for sub in folder.rglob("*.py"):
            if "__pycache__" not in sub.parts and sub.parent not in listed:
                pytest.fail(f"{sub.relative_to(ROOT)} is in no package that pyproject.toml lists "
                            "([tool.setuptools] packages): it would be left out of the wheel")


_IMPORT_ALL = """
import importlib, json, sys, traceback
failures = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failures[name] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
print(json.dumps(failures))
"""


def test_every_module_imports_under_this_interpreter() -> None:
    """In a fresh interpreter (no import order from other tests to lean on); optional dependencies that the dev
    extra installs (triton, kopf, kubernetes) must be there too."""
    modules = package_modules()
    assert len(modules) > 40 and "hetero_infer.bench.overhead" in modules and "hetero_infer.operator.cli" in modules
    proc = subprocess.run([sys.executable, "-c", _IMPORT_ALL, *modules], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    failures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert failures == {}, "\n".join(f"{k}: {v}" for k, v in failures.items())


def test_no_module_needs_more_than_python_3_10() -> None:
    files = [f for folder in package_folders().values() for f in sorted(folder.glob("*.py"))]
    files += sorted((ROOT / "benchmarks").glob("*.py"))
    problems = [p for f in files for p in python_3_10_problems(f.read_text(), str(f.relative_to(ROOT)))]
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("source", [
    "import tomllib\n",
    "def f():\n    import tomllib\n",
    "from wsgiref.types import WSGIApplication\n",
    "from typing import Self\n",
    "import typing as t\nx: t.Any = t.Never\n",
    "import asyncio\nasync def f():\n    async with asyncio.TaskGroup():\n        pass\n",
    "from enum import StrEnum\n",
    "raise ExceptionGroup('x', [ValueError()])\n",
    "try:\n    pass\nexcept* ValueError:\n    pass\n",
])
def test_the_check_finds_what_python_3_10_lacks(source: str) -> None:
    assert python_3_10_problems(source)


@pytest.mark.parametrize("source", [
    "try:\n    import tomllib\nexcept ModuleNotFoundError:\n    import tomli as tomllib\n",
    "import sys\nif sys.version_info >= (3, 11):\n    import tomllib\nelse:\n    import tomli as tomllib\n",
    "import asyncio\nasyncio.wait_for(x, 1)\n",
    "from typing import Any, Literal\nmatch x:\n    case 1:\n        pass\n",
    "from __future__ import annotations\ndef f() -> int | None: ...\n",
])
def test_the_check_lets_3_10_code_pass(source: str) -> None:
    assert python_3_10_problems(source) == []


def test_the_server_and_the_operator_never_import_the_benchmarks() -> None:
    """hetero_infer.bench stays apart: only the command dispatcher (hetero_infer.cli) reaches it."""
    offenders = []
    for package, folder in package_folders().items():
        if package.startswith(("hetero_infer.worker", "hetero_infer.kernels", "hetero_infer.operator")):
            for f in sorted(folder.glob("*.py")):
                for node in ast.walk(ast.parse(f.read_text())):
                    names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                             [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                    offenders += [f"{f.relative_to(ROOT)}: {n}" for n in names if n.startswith("hetero_infer.bench")]
    assert offenders == []


# -- the seams: the router and the operator share contracts, never the worker's code ---------------------
# What neither may load: the engine (worker/, kernels/) and its heavy dependencies. The operator image has none
# of them, and the router runs from that image.
FORBIDDEN = ("hetero_infer.worker", "hetero_infer.kernels", "torch", "transformers", "triton")
# The router shares nothing with the operator either but contracts (both ship in one image, but the router is its
# own program: a change in the operator must not move it).
ROUTER_FORBIDDEN = (*FORBIDDEN, "hetero_infer.operator")
# Where the router loads a tokenizer (transformers, hence torch where installed): still neither the worker nor the
# operator.
PROGRAMS_ONLY = ("hetero_infer.worker", "hetero_infer.kernels", "hetero_infer.operator")

_SEAM_CHECK = """
import importlib, json, sys, traceback
FORBIDDEN = tuple(sys.argv[1].split(","))
seen = {}

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name.startswith(FORBIDDEN) and name not in seen:
            ours = [f"{fr.filename.rsplit('/', 2)[-2]}/{fr.filename.rsplit('/', 1)[-1]}:{fr.lineno}"
                    for fr in traceback.extract_stack()[:-1] if "hetero_infer" in fr.filename
                    or "/router/" in fr.filename or "/operator/" in fr.filename or "/contracts/" in fr.filename]
            seen[name] = " <- ".join(reversed(ours[-4:]))
        return None

sys.meta_path.insert(0, Watch())
for name in sys.argv[2:]:
    importlib.import_module(name)
exec(sys.stdin.read())  # what runs lazily: a chat prompt hashed by the router, an object rendered by the operator
print(json.dumps(seen))
"""

_ROUTER_AT_WORK = """
from hetero_infer.router.prompt import request_hashes

class Tok:  # the router's tokenizer as the router uses it (contracts/tokenizer.py loads the real one)
    hf = type("HF", (), {"chat_template": "{{ tools }}"})()
    def apply_chat_template(self, messages, **kwargs):
        return list(range(40))
    def encode(self, text):
        return list(range(40))

hashes, exact = request_hashes({"messages": [{"role": "user", "content": "hi"}], "tools": [
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, Tok(), 16, 64)
assert exact and len(hashes) == 2, (hashes, exact)
"""

_OPERATOR_AT_WORK = """
from hetero_infer.operator.manifests import Owner, children
from hetero_infer.operator.spec import parse_spec

spec = parse_spec({"model": {"name": "m"}, "engine": {"blockSize": 32, "memoryThreshold": 0.85},
                   "autoscaling": {"enabled": True, "mode": "hpa", "minReplicas": 1, "maxReplicas": 3},
                   "router": {"enabled": True, "cors": {"allowedOrigins": ["https://a.example"]},
                              "inferencePool": {"endpointPicker": "epp"}}}, "m")
assert len(children(Owner("m", "ns", "uid"), spec).all()) == 11
"""


def _modules_under(folder: str) -> list[str]:
    return [m for m in package_modules() if m == folder or m.startswith(folder + ".")]


def seam_violations(modules: list[str], at_work: str = "", forbidden: tuple[str, ...] = FORBIDDEN) -> dict[str, str]:
    """The forbidden modules that importing `modules` (then running `at_work`) loads, each with the chain of this
    project's frames that imported it."""
    proc = subprocess.run([sys.executable, "-c", _SEAM_CHECK, ",".join(forbidden), *modules], input=at_work,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("program, at_work, forbidden", [("hetero_infer.router", _ROUTER_AT_WORK, ROUTER_FORBIDDEN),
                                                         ("hetero_infer.operator", _OPERATOR_AT_WORK, FORBIDDEN)],
                         ids=["router", "operator"])
def test_the_router_and_the_operator_import_neither_the_worker_nor_torch(program: str, at_work: str,
                                                                        forbidden: tuple[str, ...]) -> None:
    """Every module of the program, imported in a fresh interpreter, and its lazy paths run: what it shares with
    the worker (and the router with the operator) comes from hetero_infer.contracts."""
    modules = _modules_under(program)
    assert len(modules) > 8
    violations = seam_violations(modules, at_work, forbidden)
    assert violations == {}, "\n".join(f"{k}: imported at {v}" for k, v in violations.items())


_ROUTER_LOADING = """
import os, pathlib, tempfile
from hetero_infer.router.kube_api import api_access
from hetero_infer.router.scale import scale_path
from hetero_infer.router.tokenizer_source import load_tokenizer

tmp = pathlib.Path(tempfile.mkdtemp())
(tmp / "config").write_text('''apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
''')
os.environ["KUBECONFIG"] = str(tmp / "config")
access = api_access()
assert access.host == "http://127.0.0.1:1" and access.headers()["Authorization"] == "Bearer t", access.headers()
assert scale_path("ns", "m").endswith("/inferencedeployments/m/scale")
assert load_tokenizer("default") is not None  # --tokenizer default: the default model's tokenizer
"""


def test_the_routers_tokenizer_and_kubeconfig_paths_import_neither_the_worker_nor_the_operator() -> None:
    """`--tokenizer default` and the kubeconfig credentials (discovery, scale from zero) load transformers and the
    kubernetes package, never a worker or operator module."""
    violations = seam_violations(["hetero_infer.router.app"], _ROUTER_LOADING, PROGRAMS_ONLY)
    assert violations == {}, "\n".join(f"{k}: imported at {v}" for k, v in violations.items())


def test_the_seam_check_finds_the_operator_under_the_router() -> None:
    violations = seam_violations(["hetero_infer.router.app"], "import hetero_infer.operator.kube\n", PROGRAMS_ONLY)
    assert "hetero_infer.operator.kube" in violations


def test_the_contracts_import_neither_the_worker_nor_torch() -> None:
    """All but the tokenizer wrapper, whose transformers imports torch wherever torch is installed (not in the
    operator image); it still imports nothing of the worker."""
    modules = _modules_under("hetero_infer.contracts")
    assert "hetero_infer.contracts.protocol" in modules and "hetero_infer.contracts.tokenizer" in modules
    assert seam_violations([m for m in modules if m != "hetero_infer.contracts.tokenizer"]) == {}
    engine = {k: v for k, v in seam_violations(["hetero_infer.contracts.tokenizer"]).items()
              if k.startswith(("hetero_infer.worker", "hetero_infer.kernels"))}
    assert engine == {}


_RUNNER_AT_WORK = """
from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.step import StepPlan
from hetero_infer.worker.runner.executors import ModelFiles, executor_kind

ex = executor_kind("mock").create(EngineConfig(executor="mock", mock_logits=True), ModelFiles(".", None, 64, 1000))
plan = StepPlan([1], [[5, 6, 7]], [0], [True], {1: (0, [0])}, {1: [5, 6, 7]})
assert len(ex.execute_async(plan, None).result()[0]) == 1
"""


def test_the_runner_imports_nothing_of_the_engine_core_but_the_step_contract() -> None:
    """worker/runner (every module, and a step run on an executor from the registry) loads no module of the engine
    core, nor of the frontends or the server: the core hands it plain data (hetero_infer/contracts/step.py)."""
    modules = _modules_under("hetero_infer.worker.runner")
    assert "hetero_infer.worker.runner.executors" in modules and "hetero_infer.worker.runner.executor" in modules
    forbidden = ("hetero_infer.worker.core", "hetero_infer.worker.frontend", "hetero_infer.worker.server")
    violations = seam_violations(modules, _RUNNER_AT_WORK, forbidden)
    assert violations == {}, "\n".join(f"{k}: imported at {v}" for k, v in violations.items())


def test_the_seam_check_finds_an_import_of_the_worker() -> None:
    violations = seam_violations(["hetero_infer.contracts.options"], "import hetero_infer.worker.server.errors\n")
    assert "hetero_infer.worker.core" in violations and "hetero_infer.worker.server.errors" in violations


def test_the_project_lint_passes():
    """ruff with pyproject.toml's rules over the whole tree: undefined names (F821), imports under TYPE_CHECKING
    that are used at run time (TC004: a module made lazy about torch that still names it where it runs), unused
    imports, the import order."""
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]

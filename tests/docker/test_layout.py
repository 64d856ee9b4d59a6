"""The repository layout never shadows the standard library, and the package installs whole.

These run in the default suite (no Docker needed): the images depend on them, and so does any Python
started in the repository root (a Dockerfile's WORKDIR, `python -c`, the test suite).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib  # the dev extra installs it on 3.10

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_MODULES = sorted(p.stem for p in (ROOT / "operator").glob("*.py") if p.stem != "__init__")


def _site_path() -> str:
    """The interpreter's package folders, for a `python -S` that must still find pytest and the deps."""
    return os.pathsep.join(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))


def _plain(*args: str, cwd: Path, pythonpath: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -S ...`: no site hooks (.pth files, editable-install finders) run before the code does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-S", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_no_regular_package_at_the_root_is_named_like_a_standard_module() -> None:
    shadowing = [p.name for p in ROOT.iterdir()
                 if p.name in sys.stdlib_module_names and ((p / "__init__.py").exists() or p.suffix == ".py")]
    assert shadowing == [], f"these shadow the standard library for any Python started in {ROOT}"


def test_plain_python_in_the_repository_root_imports_the_standard_library() -> None:
    proc = _plain("-c", "import collections, typing, operator; print(operator.__file__)", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).parent == Path(sysconfig.get_paths()["stdlib"])


def test_plain_python_makes_a_venv_in_the_repository_root(tmp_path: Path) -> None:
    proc = _plain("-m", "venv", "--without-pip", str(tmp_path / "venv"), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "venv" / "bin" / "python").exists()


def test_the_suite_runs_from_the_repository_root_under_plain_python() -> None:
    # Without site hooks the editable install's finder is absent too: the checkout itself must import.
    proc = _plain("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/operator/test_operator_manifests.py",
                  cwd=ROOT, pythonpath=_site_path())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"\d+ passed", proc.stdout)


def test_the_installed_package_imports_every_operator_module(tmp_path: Path) -> None:
    # Whatever install this interpreter has (editable in CI), from a folder outside the checkout.
    code = "; ".join(f"import hetero_infer.operator.{m}" for m in OPERATOR_MODULES)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "hetero_infer.cli", "operator", "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "usage: hetero-infer operator" in proc.stdout, proc.stderr


def _package_sources() -> list[str]:
    """pyproject.toml, README.md and the top-level folders that pyproject's packages come from."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {folder.split("/")[0] for folder in setuptools.get("package-dir", {}).values()}
    folders |= {package.split(".")[0] for package in setuptools["packages"]}
    return ["pyproject.toml", "README.md", *sorted(f for f in folders if (ROOT / f).is_dir())]


def test_pyproject_lists_every_package_folder() -> None:
    """setuptools installs only the listed packages: a subpackage left out imports from a checkout (the editable
    install, the tests) but is missing from every wheel and image."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for package, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]))
    missing = sorted(found - set(setuptools["packages"]))
    assert missing == [], f"package folders not in pyproject's [tool.setuptools] packages: {missing}"


def test_a_wheel_installs_the_operator_whole(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for rel in _package_sources():  # a copy keeps build/ out of the checkout
        if (ROOT / rel).is_dir():
            shutil.copytree(ROOT / rel, src / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copyfile(ROOT / rel, src / rel)
    # The installed setuptools where there is one (fast, offline); else pip's isolated build environment.
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", *isolation,
                    "--wheel-dir", str(tmp_path / "dist"), str(src)], check=True, timeout=600)
    (wheel,) = (tmp_path / "dist").glob("hetero_infer-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"hetero_infer/operator/{m}.py" for m in OPERATOR_MODULES} <= set(names)
    assert not any(n.split("/")[0] == "operator" for n in names), "a top-level `operator` would shadow the stdlib"
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, timeout=300)
    # Only the wheel's copy is importable (no checkout on the path, no editable finder: -S).
    path = os.pathsep.join([str(target), _site_path()])
    code = (f"import hetero_infer.operator as o; assert o.__path__[0].startswith({str(target)!r}), o.__path__; "
            + "; ".join(f"import hetero_infer.operator.{m}" for m in OPERATOR_MODULES))
    proc = _plain("-c", code, cwd=tmp_path, pythonpath=path)
    assert proc.returncode == 0, proc.stderr
    proc = _plain("-m", "hetero_infer.cli", "operator", "--help", cwd=tmp_path, pythonpath=path)
    assert proc.returncode == 0 and "usage: hetero-infer operator" in proc.stdout, proc.stderr


def _third_party_imports(folder: Path) -> set[str]:
    names: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "hetero_infer"}


def _closure(requirements: list[str]) -> set[str]:
    """The distributions `requirements` install on this interpreter, with their own requirements."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        todo += [Requirement(r) for r in metadata.requires(name) or []]
    return seen


def _router_tokenizer_requirements() -> list[str]:
    """What docker/operator.Dockerfile installs beside the extra so the router can load the workers' tokenizer
    and parse chat requests (hetero_infer/contracts: tokenizer.py, protocol.py)."""
    text = (ROOT / "docker" / "operator.Dockerfile").read_text()
    return re.search(r'^ARG ROUTER_TOKENIZER_REQUIREMENTS="([^"]*)"', text, re.M).group(1).split()


@pytest.mark.parametrize("folder", ["operator", "router", "hetero_infer/contracts"])
def test_the_operator_extra_carries_every_module_the_operator_imports(folder: str) -> None:
    """The operator image installs the package with --no-deps plus this extra; the router runs from it too, and
    both share hetero_infer/contracts (its tokenizer and chat parsing with the image's router requirements)."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["operator"]
    if folder == "hetero_infer/contracts":
        extra = [*extra, *_router_tokenizer_requirements()]
    installed = _closure(extra)
    providers = metadata.packages_distributions()
    missing = {}
    for module in _third_party_imports(ROOT / folder):
        dists = {canonicalize_name(d) for d in providers.get(module, [])}
        if not dists & installed:
            missing[module] = sorted(dists)
    assert missing == {}, f"imported by {folder}/ but not installed by the `operator` extra: {missing}"


@pytest.mark.parametrize("dockerfile", ["worker-cpu.Dockerfile", "worker.Dockerfile", "operator.Dockerfile"])
def test_every_image_copies_every_folder_of_the_package(dockerfile: str) -> None:
    """`pip install .` in the image fails on a package folder that pyproject lists but no COPY brought in."""
    text = (ROOT / "docker" / dockerfile).read_text()
    copied = {src for line in re.findall(r"^COPY (?!--)(.+) \S+$", text, re.M) for src in line.split()}
    ignore = (ROOT / "docker" / f"{dockerfile}.dockerignore").read_text().splitlines()
    for source in _package_sources():
        assert source in copied, f"{dockerfile} does not COPY {source}"
        assert f"!{source}/**" in ignore or f"!{source}" in ignore, f"{dockerfile}.dockerignore leaves {source} out"

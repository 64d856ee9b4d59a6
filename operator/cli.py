"""`hetero-infer operator`: run the kopf operator for InferenceDeployments."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sys
from typing import Any

from hetero_infer.operator import constants as c
from hetero_infer.operator import kube
from hetero_infer.operator.handlers import OperatorOptions, build_registry, make_settings
from hetero_infer.operator.manifests import WorkerDefaults

ENV_PREFIX = "HETERO_INFER_OPERATOR_"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hetero-infer operator",
        description="Reconcile InferenceDeployment resources (hetero-infer.io/v1alpha1) into worker "
                    "Deployments, Services, PodDisruptionBudgets and HPAs. Credentials: the in-cluster "
                    "service account, else the kubeconfig ($KUBECONFIG or ~/.kube/config).",
    )
    p.add_argument("--namespace", "-n", action="append", default=None, metavar="NS",
                   help="watch only this namespace (repeatable; glob patterns allowed); default: all namespaces")
    peering = p.add_mutually_exclusive_group()
    peering.add_argument("--standalone", action="store_true", default=None,
                         help="run without peering (use when only one operator replica runs)")
    peering.add_argument("--peering", metavar="NAME", default=None,
                         help="coordinate with other replicas through this (Cluster)KopfPeering object: "
                              "only the highest-priority live replica works, the others stand by")
    p.add_argument("--priority", type=int, default=None,
                   help="peering priority (default with --peering: random, so exactly one replica is active)")
    p.add_argument("--liveness", metavar="URL", default=None,
                   help="serve a liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--worker-image", default=os.environ.get(f"{ENV_PREFIX}WORKER_IMAGE", c.DEFAULT_WORKER_IMAGE),
                   help="worker image for CPU pods when a spec gives none (env HETERO_INFER_OPERATOR_WORKER_IMAGE)")
    p.add_argument("--worker-gpu-image",
                   default=os.environ.get(f"{ENV_PREFIX}WORKER_GPU_IMAGE", c.DEFAULT_WORKER_GPU_IMAGE),
                   help="worker image for GPU pods when a spec gives none (env HETERO_INFER_OPERATOR_WORKER_GPU_IMAGE)")
    p.add_argument("--image-pull-policy", choices=("Always", "IfNotPresent", "Never"),
                   default=os.environ.get(f"{ENV_PREFIX}IMAGE_PULL_POLICY") or None,
                   help="imagePullPolicy of worker containers (default: Kubernetes' default for the tag)")
    p.add_argument("--resync-seconds", type=float, default=60.0,
                   help="how often every InferenceDeployment is reconciled even without changes (default 60)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve the operator's Prometheus metrics (autoscaling decisions, scrape errors, "
                        "desired replicas) on this port at /metrics (default: off)")
    p.add_argument("--scrape-timeout", type=float, default=2.0, metavar="SECONDS",
                   help="timeout of one worker /metrics request in autoscaling mode operator (default 2)")
    p.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    return p


def operator_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for kopf.operator / kopf.spawn_tasks from parsed flags."""
    options = OperatorOptions(
        defaults=WorkerDefaults(image=args.worker_image, gpu_image=args.worker_gpu_image,
                                image_pull_policy=args.image_pull_policy),
        resync_seconds=args.resync_seconds,
        scrape_timeout=args.scrape_timeout,
    )
    priority = args.priority
    if args.peering and priority is None:
        priority = random.SystemRandom().randint(1, 2**31 - 1)
    namespaces = list(args.namespace or [])
    return {
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
    args = build_parser().parse_args(argv)
    if args.resync_seconds <= 0:
        build_parser().error("--resync-seconds must be > 0")
    if args.scrape_timeout <= 0:
        build_parser().error("--scrape-timeout must be > 0")
    if args.metrics_port is not None and not 0 < args.metrics_port < 65536:
        build_parser().error("--metrics-port must be in 1..65535")
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
        from hetero_infer.operator import metrics

        metrics.serve(args.metrics_port)
        logging.getLogger("hetero_infer.operator").info(f"metrics on :{args.metrics_port}/metrics")
    try:
        asyncio.run(kopf.operator(**kwargs))
    except KeyboardInterrupt:
        return 130
    return 0

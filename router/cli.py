"""`hetero-infer router`: one OpenAI-compatible endpoint in front of a model's workers.

Options: flags > HETERO_INFER_ROUTER_<OPTION> environment > --config FILE (JSON or YAML, snake_case keys).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from aiohttp import web

from hetero_infer.contracts.options import add_config_flag, add_flags, load_options
from hetero_infer.contracts.router_options import ENV_PREFIX, HELP, RouterOptions
from hetero_infer.router.app import Router, build, make_runner
from hetero_infer.router.cluster import Cluster
from hetero_infer.router.discovery import Discovery
from hetero_infer.router.drain import Drain
from hetero_infer.router.pool import WorkerPool
from hetero_infer.router.scale import ScaleFromZero

logger = logging.getLogger("hetero_infer.router")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hetero-infer router", description=__doc__.splitlines()[0])
    add_config_flag(parser, ENV_PREFIX)
    add_flags(parser, RouterOptions, HELP)
    return parser


def resolve_options(argv: list[str], environ: dict[str, str] | None = None) -> RouterOptions:
    args = build_parser().parse_args(argv)
    (options,) = load_options((RouterOptions,), args, ENV_PREFIX, environ)
    return options


def add_discovery(app: web.Application, pool: WorkerPool, options: RouterOptions) -> Discovery | None:
    """With --discover-service: watch its EndpointSlices while the app runs (started after the router's own
    start-up, so the pool has its HTTP session)."""
    if not options.discover_service:
        return None
    discovery = Discovery(pool, options.discover_service, options.namespace, options.discover_port)

    async def start_discovery(_: web.Application) -> None:
        await discovery.start()

    async def stop_discovery(_: web.Application) -> None:
        await discovery.stop()

    app.on_startup.append(start_discovery)
    app.on_cleanup.insert(0, stop_discovery)
    return discovery


def add_scale_from_zero(app: web.Application, router: Router, options: RouterOptions) -> ScaleFromZero | None:
    """With --scale-target: a request held while no worker is ready asks for one replica at once (scale.py)."""
    if not options.scale_target:
        return None
    scaler = ScaleFromZero(options.scale_target, options.namespace,
                           on_result=lambda result: router.metrics.scale_from_zero.labels(result).inc())

    async def start_scaler(_: web.Application) -> None:
        await scaler.start()

    async def stop_scaler(_: web.Application) -> None:
        await scaler.stop()

    router.scaler = scaler
    app.on_startup.append(start_scaler)
    app.on_cleanup.insert(0, stop_scaler)
    return scaler


def add_cluster(app: web.Application, router: Router, options: RouterOptions) -> Cluster | None:
    """With --discover-inference-deployments: front the namespace's InferenceDeployments while the app runs."""
    if not options.discover_inference_deployments:
        return None
    cluster = Cluster(router, options.namespace, options.selector)

    async def start_cluster(_: web.Application) -> None:
        await cluster.start()

    async def stop_cluster(_: web.Application) -> None:
        await cluster.stop()

    app.on_startup.append(start_cluster)
    app.on_cleanup.insert(0, stop_cluster)
    return cluster


async def serve(options: RouterOptions) -> None:
    router, app = build(options)
    add_discovery(app, router.pool, options)
    add_scale_from_zero(app, router, options)
    add_cluster(app, router, options)
    drain = Drain()
    drain.install(app)
    runner = make_runner(app, options.shutdown_grace_s)
    await runner.setup()
    site = web.TCPSite(runner, options.host, options.port)
    await site.start()
    port = runner.addresses[0][1] if runner.addresses else options.port
    print(f"hetero-infer router listening on http://{options.host}:{port} "
          f"(policy {options.policy}, {len(options.worker)} workers"
          + (f", discovering the endpoints of service {options.discover_service}" if options.discover_service
             else "")
          + (", fronting the namespace's InferenceDeployments" if options.discover_inference_deployments else "")
          + ")", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await drain.run(runner, options.shutdown_grace_s)


def main(argv: list[str] | None = None) -> int:
    try:
        options = resolve_options(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        print(f"hetero-infer router: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=options.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not options.worker and not options.discover_service and not options.discover_inference_deployments:
        logger.warning("no --worker given: every request is held until the hold time-out")
    asyncio.run(serve(options))
    return 0

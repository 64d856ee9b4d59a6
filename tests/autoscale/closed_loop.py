"""A closed autoscaling loop without a cluster: real workers, real load, the operator's real code.

- Workers: `hetero-infer serve --executor mock` processes with a per-step latency and a small KV
  pool, so their queue and KV usage react to load the way a GPU worker's do. They load for a few
  seconds after start (not ready) like a pod loading its model.
- `Deployment`: this harness in the role of the Deployment controller and the kubelet. It starts
  worker processes when replicas go up, stops the ones the ReplicaSet controller would pick when
  they go down (not-ready first, then the newest), notices a dead worker after a probe delay (until
  then the pod still looks ready but does not answer) and starts a replacement.
- `LoadGenerator`: open-loop arrivals at a settable rate, sent round-robin to the ready workers (as a
  Service would), non-streaming completions with a fixed number of generated tokens.
- The operator: `scaling.Autoscaler.step` (the scraper and `autoscale.decide` the kopf daemon uses),
  called every `interval` with the harness's endpoints; its decision becomes the replica count.

`run_scenario` returns the recorded trajectory (one row per autoscaling pass); tests assert on it,
and `python tests/autoscale/closed_loop.py --plot docs/autoscaling.png` draws it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from hetero_infer.operator.autoscale.decision import KV_CACHE_USAGE, QUEUE_DEPTH, Policy
from hetero_infer.operator.autoscale.loop import Autoscaler
from hetero_infer.operator.autoscale.scrape import Endpoint

_LISTENING = re.compile(r"listening on (http://\S+:\d+)")


@dataclass(frozen=True)
class WorkerConfig:
    """A light mock worker whose KV pool, not its batch size, limits it (like a GPU worker)."""

    step_latency_s: float = 0.04
    num_blocks: int = 40
    block_size: int = 16
    max_num_seqs: int = 16  # the KV pool (40 blocks, ~12 sequences at the 0.9 threshold) limits first
    max_queue_len: int = 16  # beyond max_num_seqs + this, 429: an overloaded worker sheds load
    max_model_len: int = 128
    prompt_tokens: int = 16
    max_tokens: int = 48

    def args(self) -> list[str]:
        return ["--executor", "mock", "--mock-step-latency-s", str(self.step_latency_s),
                "--max-num-blocks", str(self.num_blocks), "--block-size", str(self.block_size),
                "--max-num-seqs", str(self.max_num_seqs), "--max-model-len", str(self.max_model_len),
                "--no-enable-prefix-caching", "--max-queue-len", str(self.max_queue_len), "--shutdown-grace", "3",
                "--log-format", "text", "--no-access-log", "--served-model-name", "mock"]


class Worker:
    """One `hetero-infer serve` process (a pod)."""

    def __init__(self, name: str, config: WorkerConfig) -> None:
        self.name = name
        self.config = config
        self.proc: asyncio.subprocess.Process | None = None
        self.url = ""
        self.ready = False
        self.terminating = False
        self.started_at = time.monotonic()
        self.ready_at: float | None = None
        self.died_at: float | None = None  # when the harness noticed the process had exited
        self.log: list[str] = []
        self._tasks: list[asyncio.Task[Any]] = []

    async def start(self, session: aiohttp.ClientSession) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hetero_infer.cli", "serve", "--port", "0", *self.config.args(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._probe(session))]

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            self.log.append(line)
            del self.log[:-200]
            m = _LISTENING.search(line)
            if m and not self.url:
                self.url = m.group(1)

    async def _probe(self, session: aiohttp.ClientSession) -> None:
        """The readiness probe: /readyz every 0.25 s until it answers 200 once."""
        while not self.ready and self.alive:
            if self.url:
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    async with session.get(self.url + "/readyz", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            self.ready, self.ready_at = True, time.monotonic()
                            return
            await asyncio.sleep(0.25)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill would."""
        if self.alive:
            assert self.proc is not None
            self.proc.kill()

    def terminate(self) -> None:
        self.terminating = True
        self.ready = False
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)

    async def wait(self, timeout: float = 15.0) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None:
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class Deployment:
    """The Deployment controller + kubelet for worker processes."""

    def __init__(self, config: WorkerConfig, session: aiohttp.ClientSession, probe_delay: float = 1.5) -> None:
        self.config = config
        self.session = session
        self.replicas = 0
        self.workers: list[Worker] = []
        self.stopping: list[Worker] = []
        self.probe_delay = probe_delay  # how long a dead worker still counts as ready (failing probes)
        self.started = 0
        self.replaced = 0
        self._counter = 0

    def endpoints(self) -> list[Endpoint]:
        """What the operator would list: the pods of the Deployment that are not terminating."""
        return [Endpoint(w.name, w.url, w.ready and bool(w.url)) for w in self.workers]

    def ready_workers(self) -> list[Worker]:
        return [w for w in self.workers if w.ready and w.alive and w.url]

    async def _start_one(self) -> None:
        self._counter += 1
        worker = Worker(f"worker-{self._counter}", self.config)
        await worker.start(self.session)
        self.workers.append(worker)
        self.started += 1

    async def reconcile(self) -> None:
        now = time.monotonic()
        for w in list(self.workers):
            if not w.alive:
                if w.died_at is None:
                    w.died_at = now
                if now - w.died_at >= self.probe_delay:  # the probes have failed: replace the pod
                    self.workers.remove(w)
                    self.stopping.append(w)
                    self.replaced += 1
        while len(self.workers) < self.replicas:
            await self._start_one()
        while len(self.workers) > self.replicas:
            # The ReplicaSet controller deletes unready pods first, then the newest.
            victim = sorted(self.workers, key=lambda w: (w.ready, w.started_at))[0]
            self.workers.remove(victim)
            victim.terminate()
            self.stopping.append(victim)
        for w in list(self.stopping):
            if not w.alive:
                self.stopping.remove(w)
                await w.wait()

    async def scale(self, replicas: int) -> None:
        self.replicas = replicas
        await self.reconcile()

    async def run(self, stop: asyncio.Event, period: float = 0.2) -> None:
        while not stop.is_set():
            await self.reconcile()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), period)

    async def shutdown(self) -> None:
        everyone = self.workers + self.stopping
        for w in everyone:
            w.terminate()
        await asyncio.gather(*(w.wait(10) for w in everyone))
        self.workers, self.stopping = [], []


@dataclass
class LoadStats:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    rejected: int = 0  # 429 from an overloaded worker
    unroutable: int = 0  # no ready worker at arrival
    failed_by_worker: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)


class LoadGenerator:
    """Open-loop arrivals at `rate` requests/s to the ready worker with the fewest outstanding requests.

    (What a gateway in front of LLM workers does; a backlog on one worker is not fed further.)
    """

    def __init__(self, deployment: Deployment, session: aiohttp.ClientSession, config: WorkerConfig) -> None:
        self.deployment = deployment
        self.session = session
        self.config = config
        self.rate = 0.0
        self.stats = LoadStats()
        self.in_flight: set[asyncio.Task[None]] = set()
        self._rr = 0
        self.outstanding: dict[str, int] = {}
        self._prompt = [1000 + i for i in range(config.prompt_tokens)]

    async def _one(self, worker: str, url: str) -> None:
        started = time.monotonic()
        body = {"model": "mock", "prompt": self._prompt, "max_tokens": self.config.max_tokens,
                "ignore_eos": True, "temperature": 0}
        try:
            async with self.session.post(url + "/v1/completions", json=body,
                                         timeout=aiohttp.ClientTimeout(total=120)) as r:
                await r.read()
                status = r.status
        except (aiohttp.ClientError, asyncio.TimeoutError):
            status = 0
        finally:
            self.outstanding[url] -= 1
        if status == 200:
            self.stats.ok += 1
            self.stats.latencies.append(time.monotonic() - started)
        elif status == 429:
            self.stats.rejected += 1
        else:
            self.stats.failed += 1
            self.stats.failed_by_worker[worker] = self.stats.failed_by_worker.get(worker, 0) + 1

    def burst(self, n: int) -> None:
        for _ in range(n):
            self._send()

    def _send(self) -> None:
        ready = self.deployment.ready_workers()
        self.stats.sent += 1
        if not ready:
            self.stats.unroutable += 1
            return
        self._rr += 1
        worker = min(ready, key=lambda w: (self.outstanding.get(w.url, 0), (hash(w.name) + self._rr) % 7))
        self.outstanding[worker.url] = self.outstanding.get(worker.url, 0) + 1
        task = asyncio.create_task(self._one(worker.name, worker.url))
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        credit = 0.0
        last = loop.time()
        while not stop.is_set():
            await asyncio.sleep(0.02)
            now = loop.time()
            credit += self.rate * (now - last)
            last = now
            while credit >= 1.0:
                credit -= 1.0
                self._send()
            if self.rate == 0:
                credit = 0.0

    async def drain(self) -> None:
        for task in list(self.in_flight):
            task.cancel()
        await asyncio.gather(*self.in_flight, return_exceptions=True)


Until = Callable[[Sequence["Sample"]], bool]


@dataclass(frozen=True)
class Phase:
    """Offered load for a while: `burst` requests at once, then `rate` requests/s.

    The phase lasts at least `min_seconds`; then it ends as soon as `until` (given the phase's samples)
    holds, and at the latest after `max_seconds` (`ended_by` says which, so a test can fail on it).
    `kill` SIGKILLs one ready worker as the phase starts.
    """

    name: str
    rate: float
    min_seconds: float = 0.0
    max_seconds: float = 60.0
    burst: int = 0
    kill: bool = False
    until: Until | None = None


@dataclass
class Sample:
    """One autoscaling pass."""

    t: float
    tick: int
    phase: str
    current: int  # replicas before the decision
    replicas: int  # replicas after it (what the operator would write to spec.replicas)
    ready: int
    pods: int
    kv: float | None  # average over the ready workers that answered
    queue: float | None
    reason: str
    recommendation: int  # the largest signal's, bounded by min/max (before stabilization)
    kv_recommendation: int | None
    queue_recommendation: int | None
    scrape_errors: int
    rate: float


@dataclass
class Trajectory:
    policy: dict[str, Any]
    interval: float
    phases: list[dict[str, Any]] = field(default_factory=list)  # name, rate, start, end, ended_by, ticks
    samples: list[Sample] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # kills
    load: dict[str, Any] = field(default_factory=dict)
    workers_started: int = 0
    workers_replaced: int = 0

    def phase(self, name: str) -> dict[str, Any]:
        return next(p for p in self.phases if p["name"] == name)

    def in_phase(self, name: str) -> list[Sample]:
        return [s for s in self.samples if s.phase == name]

    def changes(self) -> list[Sample]:
        return [s for s in self.samples if s.replicas != s.current]

    def to_json(self) -> str:
        return json.dumps({"policy": self.policy, "interval": self.interval, "phases": self.phases,
                           "events": self.events, "load": self.load, "workers_started": self.workers_started,
                           "workers_replaced": self.workers_replaced,
                           "samples": [asdict(s) for s in self.samples]}, indent=1)

    def table(self) -> str:
        return "\n".join(_row(s) for s in self.samples)


def _row(s: Sample) -> str:
    kv = f"{s.kv:.2f}" if s.kv is not None else "-"
    q = f"{s.queue:.1f}" if s.queue is not None else "-"
    return (f"t={s.t:6.1f} {s.phase:8} {s.current}->{s.replicas} ready={s.ready} pods={s.pods} kv={kv} "
            f"queue={q} rec=({s.kv_recommendation},{s.queue_recommendation}) {s.reason} err={s.scrape_errors}")


def queue_settled(policy: Policy, replicas: int, passes: int = 3) -> Until:
    """`replicas` workers ready and the queue under its target for the last `passes` passes."""
    def check(samples: Sequence[Sample]) -> bool:
        last = samples[-passes:]
        return len(last) == passes and all(
            s.ready == replicas and s.replicas == replicas and s.queue is not None
            and s.queue < policy.target_queue_depth for s in last)
    return check


def serving_with(replicas: int, passes: int = 3) -> Until:
    """`replicas` workers wanted and ready for the last `passes` passes (whatever the queue: how fast they drain
    it depends on the machine's CPUs, not on the autoscaler)."""
    def check(samples: Sequence[Sample]) -> bool:
        last = samples[-passes:]
        return len(last) == passes and all(s.ready == replicas and s.replicas == replicas for s in last)
    return check


def scaled_to(replicas: int) -> Until:
    def check(samples: Sequence[Sample]) -> bool:
        return bool(samples) and samples[-1].replicas == replicas and samples[-1].ready == replicas
    return check


async def _wait_ready(deployment: Deployment, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(deployment.ready_workers()) < deployment.replicas:
        if time.monotonic() > deadline:
            raise RuntimeError("workers did not become ready:\n" + "".join(
                line for w in deployment.workers for line in w.log[-20:]))
        await asyncio.sleep(0.2)


async def run_scenario(phases: Sequence[Phase], policy: Policy, interval: float = 1.0,
                       config: WorkerConfig | None = None, initial_replicas: int | None = None,
                       progress: Callable[[Sample], None] | None = None) -> Trajectory:
    """Start the workers, run the phases with the autoscaler in the loop, stop everything.

    Every `interval` (fixed cadence): scrape the endpoints and decide (the operator's code), record a
    sample, hand the replica count to the harness's Deployment controller; phase changes happen right
    after a pass, so "within k passes of the change" is exact.
    """
    config = config or WorkerConfig()
    trajectory = Trajectory(policy=asdict(policy), interval=interval)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        deployment = Deployment(config, session)
        load = LoadGenerator(deployment, session, config)
        stop = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []
        try:
            # Warm-up, not recorded: the initial replicas load their "model" before t=0.
            await deployment.scale(initial_replicas or policy.min_replicas)
            await _wait_ready(deployment, 180)
            tasks = [asyncio.create_task(deployment.run(stop)), asyncio.create_task(load.run(stop))]
            autoscaler = Autoscaler(scrape_timeout=min(2.0, interval))
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            tick = 0

            def begin(phase: Phase, now: float) -> dict[str, Any]:
                load.rate = phase.rate
                if phase.kill and deployment.ready_workers():
                    victim = deployment.ready_workers()[-1]
                    victim.kill()
                    trajectory.events.append({"t": round(now - t0, 3), "event": "kill", "worker": victim.name})
                load.burst(phase.burst)
                record = {"name": phase.name, "rate": phase.rate, "burst": phase.burst, "kill": phase.kill,
                          "start": round(now - t0, 3), "first_tick": tick}
                trajectory.phases.append(record)
                return record

            for phase in phases:
                record = begin(phase, loop.time())
                started = loop.time()
                samples: list[Sample] = []
                while True:
                    # The next pass on the fixed cadence.
                    await asyncio.sleep(max(0.0, t0 + tick * interval - loop.time()))
                    now = loop.time()
                    step = await autoscaler.step(policy, deployment.replicas, deployment.endpoints(), now, session)
                    d = step.decision
                    sample = Sample(
                        t=round(now - t0, 3), tick=tick, phase=phase.name, current=d.current, replicas=d.desired,
                        ready=len(deployment.ready_workers()), pods=len(deployment.workers),
                        kv=d.signal(KV_CACHE_USAGE).average, queue=d.signal(QUEUE_DEPTH).average,
                        reason=d.reason, recommendation=d.recommendation,
                        kv_recommendation=d.signal(KV_CACHE_USAGE).replicas,
                        queue_recommendation=d.signal(QUEUE_DEPTH).replicas, scrape_errors=len(step.errors),
                        rate=load.rate)
                    tick += 1
                    samples.append(sample)
                    trajectory.samples.append(sample)
                    if progress:
                        progress(sample)
                    if d.desired != deployment.replicas:
                        await deployment.scale(d.desired)
                    elapsed = loop.time() - started
                    if elapsed >= phase.min_seconds and (phase.until is None or phase.until(samples)):
                        ended_by = "time" if phase.until is None else "condition"
                        break
                    if elapsed >= phase.max_seconds:
                        ended_by = "timeout" if phase.until is not None else "time"
                        break
                record.update(end=round(loop.time() - t0, 3), ended_by=ended_by, ticks=len(samples))
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await load.drain()
            await deployment.shutdown()
        trajectory.workers_started = deployment.started
        trajectory.workers_replaced = deployment.replaced
        lat = sorted(load.stats.latencies)
        trajectory.load = {"sent": load.stats.sent, "ok": load.stats.ok, "failed": load.stats.failed,
                           "rejected": load.stats.rejected, "unroutable": load.stats.unroutable,
                           "failed_by_worker": load.stats.failed_by_worker,
                           "p50_latency_s": round(lat[len(lat) // 2], 3) if lat else None,
                           "p99_latency_s": round(lat[min(len(lat) - 1, math.ceil(0.99 * len(lat)) - 1)], 3)
                           if lat else None}
    return trajectory


def plot(trajectory: Trajectory, path: Path, title: str = "") -> None:
    """Replicas, queue depth and KV usage over time, with the phases shaded and named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = trajectory.samples
    t = [x.t for x in s]
    policy = trajectory.policy
    fig, axes = plt.subplots(3, 1, figsize=(12, 8), sharex=True, constrained_layout=True)
    ax_r, ax_q, ax_kv = axes
    outside = {"loc": "upper left", "bbox_to_anchor": (1.07, 1.0), "fontsize": 8, "frameon": False}

    ax_r.step(t, [x.replicas for x in s], where="post", label="replicas (decided)", color="C0", linewidth=2)
    ax_r.step(t, [x.ready for x in s], where="post", label="ready workers", color="C2", linestyle="--")
    ax_r.set_ylabel("replicas")
    ax_r.set_ylim(0, policy["max_replicas"] + 1.2)
    ax_r.set_yticks(range(0, policy["max_replicas"] + 1))
    rate_ax = ax_r.twinx()
    rate_ax.step(t, [x.rate for x in s], where="post", color="C7", linewidth=1, alpha=0.7,
                 label="offered load (req/s)")
    rate_ax.set_ylabel("req/s")
    rate_ax.set_ylim(0, max([x.rate for x in s] + [1]) * 1.15)
    h1, l1 = ax_r.get_legend_handles_labels()
    h2, l2 = rate_ax.get_legend_handles_labels()
    ax_r.legend(h1 + h2, l1 + l2, **outside)

    ax_q.plot(t, [x.queue if x.queue is not None else float("nan") for x in s], color="C1",
              label="queue depth\n(waiting per ready worker)")
    ax_q.axhline(policy["target_queue_depth"], color="C1", linestyle=":", label="targetQueueDepth")
    ax_q.set_ylabel("waiting requests")
    ax_q.legend(**outside)

    ax_kv.plot(t, [x.kv if x.kv is not None else float("nan") for x in s], color="C3",
               label="KV-cache usage\n(average over ready workers)")
    ax_kv.axhline(policy["target_kv_cache_usage"], color="C3", linestyle=":", label="targetKVCacheUsage")
    ax_kv.set_ylim(0, 1.05)
    ax_kv.set_ylabel("KV-cache usage")
    ax_kv.set_xlabel("seconds")
    ax_kv.legend(**outside)

    for i, p in enumerate(trajectory.phases):
        end = p.get("end", t[-1] if t else 0)
        for ax in axes:
            if i % 2:
                ax.axvspan(p["start"], end, color="grey", alpha=0.1, linewidth=0)
        ax_r.text(p["start"] + 0.4, 0.97, p["name"], transform=ax_r.get_xaxis_transform(), fontsize=9,
                  va="top", fontweight="bold")
    for e in trajectory.events:
        if e.get("event") == "kill":
            for ax in axes:
                ax.axvline(e["t"], color="black", linewidth=1, linestyle="--")
            ax_r.text(e["t"] + 0.4, 0.84, f"{e['worker']} killed", transform=ax_r.get_xaxis_transform(),
                      fontsize=8, va="top")
    fig.suptitle(title or (f"operator autoscaling, closed loop (mock workers): interval {trajectory.interval:g}s, "
                           f"scale-down window {policy['scale_down_stabilization_seconds']:g}s, "
                           f"replicas {policy['min_replicas']}..{policy['max_replicas']}"), fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


# -- the scenarios ---------------------------------------------------------------------------------------
# Calibration (WorkerConfig defaults): a request lives ~2 s; a worker holds ~0.14 KV per request/s and
# saturates (KV at the 0.9 admission threshold) near 6.5 requests/s.

SHORT_POLICY = Policy(min_replicas=1, max_replicas=2, target_kv_cache_usage=0.8, target_queue_depth=5.0,
                      scale_down_stabilization_seconds=5.0)
FULL_POLICY = Policy(min_replicas=1, max_replicas=3, target_kv_cache_usage=0.8, target_queue_depth=5.0,
                     scale_down_stabilization_seconds=8.0)


def short_phases(policy: Policy = SHORT_POLICY) -> list[Phase]:
    """Spike to 2 replicas, then nothing: the default test suite's loop (about a minute)."""
    return [
        Phase("idle", rate=2.0, min_seconds=2, max_seconds=2),
        Phase("spike", rate=10.0, burst=16, min_seconds=5, max_seconds=180, until=serving_with(2)),
        Phase("removed", rate=0.0, max_seconds=120, until=scaled_to(policy.min_replicas)),
    ]


def full_phases(policy: Policy = FULL_POLICY) -> list[Phase]:
    """Spike to 3 replicas, steady load, a worker killed, then nothing (docs/autoscaling.png)."""
    top = policy.max_replicas
    return [
        Phase("idle", rate=2.0, min_seconds=4, max_seconds=4),
        Phase("spike", rate=14.0, burst=20, min_seconds=10, max_seconds=180, until=queue_settled(policy, top)),
        Phase("steady", rate=14.0, min_seconds=20, max_seconds=20),
        Phase("kill", rate=14.0, kill=True, min_seconds=10, max_seconds=180, until=queue_settled(policy, top)),
        Phase("removed", rate=0.0, max_seconds=120, until=scaled_to(policy.min_replicas)),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run the closed autoscaling loop and plot it.")
    p.add_argument("--plot", type=Path, default=None, help="write the PNG here (e.g. docs/autoscaling.png)")
    p.add_argument("--json", type=Path, default=None, help="write the trajectory as JSON here")
    p.add_argument("--short", action="store_true", help="the default suite's shorter scenario")
    p.add_argument("--interval", type=float, default=1.0)
    args = p.parse_args(argv)
    policy = SHORT_POLICY if args.short else FULL_POLICY
    phases = short_phases(policy) if args.short else full_phases(policy)
    trajectory = asyncio.run(run_scenario(phases, policy, args.interval, progress=lambda s: print(_row(s),
                                                                                                flush=True)))
    print(json.dumps({"phases": trajectory.phases, "load": trajectory.load, "events": trajectory.events,
                      "workers_started": trajectory.workers_started,
                      "workers_replaced": trajectory.workers_replaced}, indent=1))
    if args.json:
        args.json.write_text(trajectory.to_json())
    if args.plot:
        plot(trajectory, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Rank 0 of a tensor-parallel engine: the `torch` executor at `tensor_parallel_size` N > 1.

The engine (scheduler, block manager, prefix cache, sampler, server, metrics) stays one, in this process; rank 0 is
a `TorchExecutor` over its shard of the model here, and ranks 1..N-1 are processes of their own
(worker/runner/parallel/rank.py). Each step's plan (the step contract, plain data) goes down every rank's stdin
pipe before rank 0 runs it; the ranks run the same step in lockstep, their collectives (gloo on the CPU, NCCL on
CUDA) pairing up; the logits are gathered once and sampled here. Each rank owns its KV heads' part of every block:
the pool the engine's block manager accounts for is one, of the smallest block count any rank can hold.

Failure: a watchdog thread sees a rank process exit within a tenth of a second; the next step (or the collective
in flight, which fails when its peer's connection closes) raises a `TensorParallelError` naming the rank and its
error, and the engine stops (the server answers 503, open streams end with an error). A rank that hangs fails the
collective after `HETERO_INFER_TP_TIMEOUT_S` seconds (default 30). In the engine's own process (`engine-core`) an
idle engine is taken down too: the process exits 1 a moment after the rank, so /readyz turns red without a request.
"""

from __future__ import annotations

import datetime
import logging
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import replace

import torch

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.step import SamplingRow, StepPlan
from hetero_infer.kernels.cpu import threads as cpu_threads
from hetero_infer.worker.runner.executor import TorchExecutor, resolve_device
from hetero_infer.worker.runner.executors import ExecutorDeadError, ModelFiles
from hetero_infer.worker.runner.loader import model_family
from hetero_infer.worker.runner.models.registry import families
from hetero_infer.worker.runner.parallel.checks import check_split
from hetero_infer.worker.runner.parallel.group import TensorParallel, process_group
from hetero_infer.worker.runner.parallel.rank import RankSpec, frame, rank_device
from hetero_infer.worker.runner.step_handle import StepHandle

log = logging.getLogger(__name__)

TIMEOUT_ENV = "HETERO_INFER_TP_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 30.0
_EXIT_GRACE_S = 2.0  # an idle engine process exits this long after a rank died (a step in flight reports first)


class TensorParallelError(ExecutorDeadError):
    """A tensor-parallel rank died, hung or failed: the engine cannot run another step."""


def check_tensor_parallel(hf_config, world_size: int, device: torch.device, quantization: str | None = None) -> None:
    """The start-up checks: the family splits, the model's shapes divide by `world_size` (in whole INT4 groups
    for int4), and on CUDA there is a GPU per rank. A ValueError saying what is wrong."""
    family = model_family(hf_config)
    if not family.supports.tensor_parallel:
        able = ", ".join(a for f in families() if f.supports.tensor_parallel for a in f.architectures)
        raise ValueError(f"{family.architectures[0]} does not support tensor parallelism (supported: {able})")
    from hetero_infer import kernels

    check_split(hf_config.to_dict(), world_size, min(kernels.INT4_GROUP_SIZES) if quantization == "int4" else None)
    if device.type == "cuda" and torch.cuda.device_count() < world_size:
        raise ValueError(f"tensor_parallel_size={world_size} needs {world_size} GPUs, "
                         f"{torch.cuda.device_count()} visible (CUDA_VISIBLE_DEVICES, the pod's GPU request)")


def threads_per_rank(world_size: int) -> int:
    """The CPU's cores shared out between the ranks (2 cores, 2 ranks: one thread each)."""
    return max(1, min(torch.get_num_threads(), cpu_threads.usable_cpus()) // world_size)


def collective_timeout_s() -> float:
    return float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S)


class TensorParallelExecutor:
    samples_itself = False
    overlaps = False  # the next step's inputs come from the host: the other ranks never see the sampled tokens

    def __init__(self, config: EngineConfig, model: ModelFiles) -> None:
        n = config.tensor_parallel_size
        self.world_size = n
        device = resolve_device(config.device)
        check_tensor_parallel(model.hf_config, n, device, config.quantization)
        self._failure: TensorParallelError | None = None
        self._closed = False
        timeout = collective_timeout_s()
        threads = threads_per_rank(n) if device.type == "cpu" else torch.get_num_threads()
        self._threads_before = torch.get_num_threads()
        import torch.distributed as dist

        self._store = dist.TCPStore("127.0.0.1", 0, n, True, timeout=datetime.timedelta(seconds=3600),
                                    wait_for_workers=False)
        backend = "nccl" if device.type == "cuda" else "gloo"
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        self._ranks: list[subprocess.Popen] = []
        self._finalizer = weakref.finalize(self, _stop_ranks, self._ranks)
        try:
            for rank in range(1, n):
                proc = subprocess.Popen([sys.executable, "-m", "hetero_infer.worker.runner.parallel.rank"],
                                        stdin=subprocess.PIPE, env=env)
                self._ranks.append(proc)
                proc.stdin.write(frame(RankSpec(rank, n, backend, self._store.port, timeout, threads, config,
                                                model.hf_config, model.folder, model.max_model_len,
                                                logging.getLogger().getEffectiveLevel())))
                proc.stdin.flush()
            log.info("tensor parallel: %d ranks (%s), %d thread(s) each; rank processes %s", n, backend, threads,
                     ", ".join(str(p.pid) for p in self._ranks))
            self._arrive("joined")
            config = replace(config, device=rank_device(config, 0))  # rank r on GPU r
            group = process_group(backend, self._store, 0, n, datetime.timedelta(seconds=timeout),
                                  torch.device(config.device) if device.type == "cuda" else None)
            if device.type == "cpu":
                torch.set_num_threads(threads)
            self.local = TorchExecutor(config, model.hf_config, model.folder, model.max_model_len,
                                       TensorParallel(0, n, group, self._arrive))
        except BaseException as exc:
            failure = self._rank_failure()
            self.close()
            if failure is not None and not isinstance(exc, TensorParallelError):
                raise failure from exc
            raise
        local = self.local
        self.vocab_size, self.num_blocks, self.num_host_blocks = local.vocab_size, local.num_blocks, local.num_host_blocks
        self.block_bytes, self.device = local.block_bytes, local.device
        # CUDA host tier: restores copied behind the step (the scheduler defers their sequences); every rank alike
        self.tier_copies_async = getattr(local, "tier_copies_async", False)
        # the watchdog holds the executor weakly: an executor dropped without close() still stops its ranks (finalizer)
        threading.Thread(target=_watch, args=(weakref.ref(self),), name="tp-watchdog", daemon=True).start()

    @property
    def rank_pids(self) -> list[int]:
        """The process ids of ranks 1..N-1."""
        return [proc.pid for proc in self._ranks]

    # -- start-up ---------------------------------------------------------------------------
    def _arrive(self, stage: str) -> None:
        """Rank 0's `TensorParallel.arrive`: mark `stage` reached, then wait for every rank to reach it, watching
        their processes meanwhile (a rank that exits is an error now, with its own message)."""
        self._store.set(f"{stage}/0", "1")
        keys = [f"{stage}/{r}" for r in range(1, self.world_size)]
        while not self._store.check(keys):
            failure = self._rank_failure()
            if failure is not None:
                raise failure
            time.sleep(0.02)

    def _rank_failure(self) -> TensorParallelError | None:
        """The error of the first rank process that exited, if one did (its own message from the store)."""
        for rank, proc in enumerate(self._ranks, start=1):
            code = proc.poll()
            if code is not None:
                return TensorParallelError(f"tensor-parallel rank {rank} (pid {proc.pid}) exited with code {code}"
                                           f"{self._rank_error(rank)}")
        return None

    def _rank_error(self, rank: int) -> str:
        key = f"error/{rank}"
        try:
            return f": {self._store.get(key).decode()}" if self._store.check([key]) else ""
        except Exception:
            return ""

    # -- steps -----------------------------------------------------------------------------
    def execute_async(self, plan: StepPlan, sampling: list[SamplingRow] | None) -> StepHandle:
        if self._failure is not None:
            raise self._failure
        try:
            data = frame(plan)
            for proc in self._ranks:
                proc.stdin.write(data)
                proc.stdin.flush()
            return self.local.execute_async(plan, sampling)
        except Exception as exc:  # a rank gone (broken pipe, a collective's peer closed) or hung (timed out)
            raise self._step_failure(exc) from exc

    def _step_failure(self, exc: Exception) -> TensorParallelError:
        deadline = time.monotonic() + 1.0  # the rank that broke the collective may be exiting still
        while time.monotonic() < deadline and self._rank_failure() is None and not isinstance(exc, BrokenPipeError):
            time.sleep(0.05)
        failure = self._failure or self._rank_failure() or TensorParallelError(
            f"tensor-parallel step failed: {type(exc).__name__}: {exc}")
        self._failure = failure
        log.error("%s; the engine stops", failure)
        return failure

    # -- failure and shutdown ---------------------------------------------------------------
    def _on_rank_failure(self, failure: TensorParallelError) -> None:
        self._failure = failure
        log.error("%s; the engine stops", failure)
        _stop_ranks(self._ranks)  # the others would wait in their next collective
        if multiprocessing.current_process().name == "engine-core":  # the engine's own process
            time.sleep(_EXIT_GRACE_S)  # a step in flight fails and reports the error first
            log.critical("tensor-parallel engine exits after the failure of a rank")
            os._exit(1)

    def close(self) -> None:
        """Stop the rank processes (end-of-file on their pipes, then a kill)."""
        self._closed = True
        self._finalizer()
        if torch.get_num_threads() != self._threads_before:
            torch.set_num_threads(self._threads_before)


def _watch(ref: weakref.ref) -> None:
    """Every 0.1 s: has a rank process exited (while the executor is open)?"""
    while (executor := ref()) is not None and not executor._closed:
        failure = executor._rank_failure()
        if failure is not None:
            if not executor._closed:
                executor._on_rank_failure(failure)
            return
        del executor
        time.sleep(0.1)


def _stop_ranks(ranks: list[subprocess.Popen], timeout: float = 5.0) -> None:
    for proc in ranks:
        try:
            proc.stdin.close()
        except Exception:
            pass
    deadline = time.monotonic() + timeout
    for proc in ranks:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


"""A tensor-parallel rank's process (ranks 1..N-1; rank 0 is the engine's own process: executor.py).

Started by rank 0 as `python -m hetero_infer.worker.runner.parallel.rank` with a pipe on its stdin: the first frame
is its `RankSpec`, every later one a step (the step contract, contracts/step.py `StepPlan`) that it runs in lockstep
with rank 0 (the model's collectives pair them up) and whose logits it drops: rank 0 samples. End-of-file on stdin
(rank 0 closed it, or died) ends it; so does rank 0's death (the kernel's parent-death signal). An error is logged,
written to the group's store for rank 0's message, and the process exits 1 (rank 0's watchdog sees it)."""

from __future__ import annotations

import datetime
import logging
import pickle
import signal
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from hetero_infer.contracts.engine_options import EngineConfig

log = logging.getLogger(__name__)

_HEADER = 8  # a frame: its length (8 bytes, big-endian), then a pickle


@dataclass(frozen=True)
class RankSpec:
    rank: int
    world_size: int
    backend: str  # gloo (CPU) or nccl (CUDA)
    port: int  # rank 0's TCP store on 127.0.0.1
    timeout_s: float  # a collective's wait for the other ranks
    threads: int  # torch's intra-op threads (CPU: the cores shared out)
    config: EngineConfig
    hf_config: Any
    folder: Path
    max_model_len: int
    log_level: int = logging.INFO


def frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(_HEADER, "big") + data


def read_frame(stream: BinaryIO) -> Any:
    """The next frame's object; None at end-of-file."""
    head = stream.read(_HEADER)
    if len(head) < _HEADER:
        return None
    size = int.from_bytes(head, "big")
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


def rank_device(config: EngineConfig, rank: int) -> str:
    """Rank r's device: GPU r on CUDA (one GPU per rank), else the CPU."""
    from hetero_infer.worker.runner.executor import resolve_device

    return f"cuda:{rank}" if resolve_device(config.device).type == "cuda" else "cpu"


def arrival(store: Any, rank: int, world_size: int, timeout_s: float):
    """A rank's `TensorParallel.arrive`: say it reached `stage`, and wait for every other rank to reach it."""
    wait = datetime.timedelta(seconds=timeout_s)

    def arrive(stage: str) -> None:
        store.set(f"{stage}/{rank}", "1")
        store.wait([f"{stage}/{r}" for r in range(world_size)], wait)

    return arrive


def _parent_death_signal() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux: end-of-file on stdin remains
        pass


def main() -> int:
    _parent_death_signal()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for rank 0, which stops us
    stdin = sys.stdin.buffer
    spec: RankSpec | None = read_frame(stdin)
    if spec is None:
        return 0
    logging.basicConfig(level=spec.log_level,
                        format=f"%(asctime)s tp-rank{spec.rank} %(levelname)s %(name)s: %(message)s")
    import torch
    import torch.distributed as dist

    from hetero_infer.worker.runner.executor import TorchExecutor
    from hetero_infer.worker.runner.parallel.group import TensorParallel, process_group

    torch.set_num_threads(spec.threads)
    timeout = datetime.timedelta(seconds=spec.timeout_s)
    load_timeout = 3600.0  # a start-up stage may wait this long for a slow rank's load
    store = dist.TCPStore("127.0.0.1", spec.port, spec.world_size, False,
                          timeout=datetime.timedelta(seconds=load_timeout))
    try:
        device = rank_device(spec.config, spec.rank)
        arrive = arrival(store, spec.rank, spec.world_size, load_timeout)
        store.set(f"joined/{spec.rank}", "1")
        torch_device = torch.device(device)
        group = process_group(spec.backend, store, spec.rank, spec.world_size, timeout,
                              torch_device if torch_device.type == "cuda" else None)
        tp = TensorParallel(spec.rank, spec.world_size, group, arrive)
        executor = TorchExecutor(replace(spec.config, device=device), spec.hf_config, spec.folder,
                                 spec.max_model_len, tp)
        log.info("rank %d of %d ready on %s (%d KV blocks)", spec.rank, spec.world_size, device, executor.num_blocks)
        while (plan := read_frame(stdin)) is not None:
            executor.execute(plan)
        return 0
    except BaseException as exc:
        log.exception("tensor-parallel rank %d failed", spec.rank)
        try:
            store.set(f"error/{spec.rank}", f"{type(exc).__name__}: {exc}"[:2000])
        except Exception:
            pass
        return 1


if __name__ == "__main__":
    sys.exit(main())

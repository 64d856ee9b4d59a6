"""The engine core: requests in, one scheduler step at a time, outputs out.

Single-threaded by design: `add_request`, `abort_request` and `step` are called from one
thread (the async server runs them in its engine thread; `LLM` calls them directly).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from itertools import repeat

from hetero_infer.worker.block_manager import BlockManager
from hetero_infer.worker.config import EngineConfig
from hetero_infer.worker.detokenizer import IncrementalDetokenizer
from hetero_infer.worker.model_loader import load_hf_config, resolve_model
from hetero_infer.worker.outputs import CompletionOutput, RequestOutput
from hetero_infer.worker.sampler import Sampler, SamplingRow, make_generator
from hetero_infer.worker.sampling_params import SamplingParams
from hetero_infer.worker.scheduler import Scheduler, SchedulerOutput
from hetero_infer.worker.sequence import Sequence, SequenceStatus
from hetero_infer.worker.tokenizer import Tokenizer

log = logging.getLogger(__name__)
_FINISHED = SequenceStatus.FINISHED


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_preemptions_total: int
    prefix_cache_queries_total: int
    prefix_cache_hits_total: int
    prompt_tokens_total: int
    generation_tokens_total: int


@dataclass(eq=False)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    error: str | None = None
    # Delta outputs (`add_request(..., delta=True)`): per sample, what earlier outputs already carried
    # ([tokens, characters of text, logprobs entries]); None for cumulative outputs.
    sent: list[list[int]] | None = None

    @property
    def finished(self) -> bool:
        return len(self.seqs) == self.params.n and all(s.is_finished for s in self.seqs)


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        folder, name = resolve_model(config.model)
        self.model_name = config.served_model_name or name
        hf_config = load_hf_config(folder)
        self.max_model_len = _max_model_len(config, hf_config)
        generation_eos = _generation_eos_ids(folder)
        self.tokenizer = Tokenizer.from_pretrained(folder, extra_eos_token_ids=generation_eos)
        if config.executor == "mock":
            from hetero_infer.worker.mock_executor import MockExecutor

            self.executor = MockExecutor(config, vocab_size=self.tokenizer.vocab_size)
        else:
            from hetero_infer.worker.model_runner import TorchExecutor

            self.executor = TorchExecutor(config, hf_config, folder, self.max_model_len)
        self.vocab_size = self.executor.vocab_size
        self.block_manager = BlockManager(self.executor.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.block_manager, config.max_num_seqs, config.max_num_batched_tokens, config.memory_threshold
        )
        self.sampler = Sampler(all_logprobs=False)  # logprobs only for requests that ask
        self.eos_token_ids = sorted(self.tokenizer.eos_token_ids)
        self.requests: dict[str, Request] = {}
        self.prompt_tokens_total = 0
        self.last_schedule: SchedulerOutput | None = None  # for benchmarks and tracing
        self.last_schedule_seconds = 0.0
        self.generation_tokens_total = 0

    # -- requests -----------------------------------------------------------------------
    def validate_request(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """Check a request without touching engine state; return its resolved max_tokens."""
        return validate_request(prompt_token_ids, params, vocab_size=self.vocab_size,
                                max_model_len=self.max_model_len, block_size=self.block_manager.block_size,
                                num_blocks=self.block_manager.num_blocks)

    def add_request(
        self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams,
        *, delta: bool = False,
    ) -> None:
        """Queue a request. Its outputs are cumulative (every output holds all the tokens, text and logprobs so
        far), or with `delta=True` carry only what is new since the request's previous output (finish reasons,
        stop reasons and cumulative logprobs stay absolute): what a streaming consumer that accumulates needs,
        without copying each request's whole output at every step."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        max_tokens = self.validate_request(prompt_token_ids, params)
        seq = self._new_sequence(request_id, list(prompt_token_ids), params, max_tokens, 0)
        seq.forks_pending = params.n - 1
        self.requests[request_id] = Request(request_id, prompt, list(prompt_token_ids), params, [seq],
                                            sent=[] if delta else None)
        self.scheduler.add(seq)

    def _new_sequence(self, request_id, token_ids, params, max_tokens, sample_index) -> Sequence:
        seq = Sequence(request_id, token_ids, len(token_ids), params, max_tokens, sample_index)
        if params.seed is not None:
            seq.generator = make_generator(params.seed, sample_index, self.executor.device)
        seq.detokenizer = IncrementalDetokenizer(self.tokenizer, token_ids, params)
        return seq

    def abort_request(self, request_id: str) -> None:
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        for seq in request.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # -- the step -----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduler step; an output for every request that got new tokens (or failed) in it."""
        return [self._output(r) for r in self._step()]

    def step_merged(self, pending: dict[str, list]) -> int:
        """One step, like `step()`, for requests added with `delta=True`: instead of returning their delta
        outputs, merge them into `pending` (request id -> merged deltas in the format of
        `hetero_infer.worker.outputs.take_entries`, with this step's end time), without building output objects.
        What a consumer that forwards outputs in batches (the engine process) needs. Returns the number of
        requests that ended (finished or failed) in this step."""
        touched = self._step()
        ended = 0
        if touched:
            step_end = time.monotonic()
            for request in touched:
                ended += self._merge_output(request, pending, step_end)
        return ended

    def _step(self) -> list[Request]:
        """Schedule and run one step; the requests that got new tokens (or failed) in it."""
        t = time.perf_counter()
        sched = self.scheduler.schedule()
        self.last_schedule_seconds = time.perf_counter() - t
        self.last_schedule = sched
        if not sched.scheduled:
            return []
        now = time.monotonic()
        for item in sched.scheduled:
            request = self.requests[item.seq.request_id]
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
        try:
            result = self.executor.execute(sched)
            return self._update(sched, result)
        except Exception as exc:  # one bad step fails only its own requests
            log.exception("engine step failed; failing the %d requests in it", len(sched.scheduled))
            return self._fail_step(sched, f"{type(exc).__name__}: {exc}")

    def _update(self, sched: SchedulerOutput, result) -> list[Request]:
        rows: list[tuple[Sequence, int]] = []  # (sequence that gets a token, logits row)
        children: list[tuple[Sequence, Sequence]] = []
        logits_row = 0
        for item in sched.scheduled:
            seq = item.seq
            samples = item.samples
            seq.num_computed_tokens += item.num_new_tokens
            self.block_manager.register_computed_blocks(seq)
            if not samples:
                continue
            rows.append((seq, logits_row))
            if seq.forks_pending:
                request = self.requests[seq.request_id]
                for _ in range(seq.forks_pending):
                    child = self._new_sequence(
                        seq.request_id, list(seq.token_ids), seq.params, seq.max_tokens, len(request.seqs)
                    )
                    request.seqs.append(child)
                    children.append((seq, child))
                    rows.append((child, logits_row))
                seq.forks_pending = 0
            logits_row += 1
        for parent, child in children:
            self.block_manager.fork(parent, child)
            self.scheduler.add_running(child)

        if self.executor.samples_itself:
            tokens = [(self.executor.next_token(s.token_ids, s.sample_index), None) for s, _ in rows]
        else:
            logits = result[[r for _, r in rows]] if children else result
            sampling_rows = [
                SamplingRow(s.params, s.token_ids[: s.num_prompt_tokens], s.output_token_ids, s.generator,
                            self.eos_token_ids)
                for s, _ in rows
            ]
            tokens = [(t.token_id, t) for t in self.sampler(logits, sampling_rows)]

        now = time.monotonic()
        touched: dict[str, Request] = {}
        for (seq, _), (token_id, sampled) in zip(rows, tokens):
            request = self.requests[seq.request_id]
            touched[request.request_id] = request
            if request.first_token_time is None:
                request.first_token_time = now
            self._append_token(seq, token_id, sampled)
        return list(touched.values())

    def _append_token(self, seq: Sequence, token_id: int, sampled) -> None:
        seq.token_ids.append(token_id)
        self.generation_tokens_total += 1
        if seq.num_output_tokens == 1:
            self.prompt_tokens_total += seq.num_prompt_tokens if seq.sample_index == 0 else 0
        if sampled is not None and sampled.logprob is not None:
            seq.cumulative_logprob += sampled.logprob
            if seq.params.logprobs is not None:
                if seq.logprobs is None:
                    seq.logprobs = []
                seq.logprobs.append(sampled.top_logprobs or {token_id: sampled.logprob})
        params = seq.params
        stop_str = seq.detokenizer.add_token(token_id)
        if seq.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token_id in self.tokenizer.eos_token_ids:
                return self.scheduler.finish(seq, "stop")
            if token_id in params.stop_token_ids:
                return self.scheduler.finish(seq, "stop", token_id)
            if stop_str is not None:
                return self.scheduler.finish(seq, "stop", stop_str)
        if seq.num_output_tokens >= seq.max_tokens or seq.num_tokens >= self.max_model_len:
            self.scheduler.finish(seq, "length")

    def _fail_step(self, sched: SchedulerOutput, message: str) -> list[Request]:
        failed: dict[str, Request] = {}
        for item in sched.scheduled:
            request = self.requests.get(item.seq.request_id)
            if request is not None:
                failed[request.request_id] = request
        for request in failed.values():
            request.error = message
            for seq in request.seqs:
                if not seq.is_finished:
                    self.scheduler.finish(seq, "error")
        return list(failed.values())

    def _output(self, request: Request) -> RequestOutput:
        seqs = request.seqs
        finished = len(seqs) == request.params.n  # every sample forked and finished (Request.finished)
        with_logprobs = request.params.logprobs is not None
        sent = request.sent
        outs = []
        for i, seq in enumerate(seqs):
            done = seq.status is _FINISHED
            finished = finished and done
            text = seq.detokenizer.emittable_text(done)
            logprobs = seq.logprobs
            if sent is None:  # cumulative
                token_ids = seq.token_ids[seq.num_prompt_tokens:]
                if logprobs is not None:
                    logprobs = list(logprobs)
            else:  # delta: only what the previous outputs did not carry
                if i == len(sent):
                    sent.append([0, 0, 0])
                s = sent[i]
                start = seq.num_prompt_tokens + s[0]
                token_ids = seq.token_ids[start:]
                s[0] += len(token_ids)
                # The emittable text only ever grows (each is a prefix of every later one).
                n_chars = len(text)
                text = text[s[1]:]
                s[1] = n_chars
                if logprobs is not None:
                    n_lp = len(logprobs)
                    logprobs = logprobs[s[2]:]
                    s[2] = n_lp
            outs.append(CompletionOutput(seq.sample_index, text, token_ids,
                                         seq.cumulative_logprob if with_logprobs else None, logprobs,
                                         seq.finish_reason, seq.stop_reason))
        finished = finished or request.error is not None
        metrics = {"arrival_time": request.arrival_time}
        if request.first_scheduled_time is not None:
            metrics["first_scheduled_time"] = request.first_scheduled_time
        if request.first_token_time is not None:
            metrics["first_token_time"] = request.first_token_time
        out = RequestOutput(request.request_id, request.prompt, request.prompt_token_ids, outs, finished, metrics)
        out.error = request.error
        if finished:
            self.requests.pop(request.request_id, None)
        return out

    def _merge_output(self, request: Request, pending: dict[str, list], step_end: float) -> bool:
        """`_output` in delta mode, merged straight into `pending` (see `step_merged`); whether the request
        ended."""
        seqs = request.seqs
        finished = len(seqs) == request.params.n
        with_logprobs = request.params.logprobs is not None
        sent = request.sent
        if sent is None:
            sent = request.sent = []
        e = pending.get(request.request_id)
        if e is None:
            metrics = {"arrival_time": request.arrival_time}
            if request.first_scheduled_time is not None:
                metrics["first_scheduled_time"] = request.first_scheduled_time
            if request.first_token_time is not None:
                metrics["first_token_time"] = request.first_token_time
            e = pending[request.request_id] = [False, None, metrics, [], [step_end]]
        else:
            e[4].append(step_end)
        samples = e[3]
        for i, seq in enumerate(seqs):
            done = seq.status is _FINISHED
            finished = finished and done
            text = seq.detokenizer.emittable_text(done)
            if i == len(sent):
                sent.append([0, 0, 0])
            s = sent[i]
            token_ids = seq.token_ids[seq.num_prompt_tokens + s[0]:]
            s[0] += len(token_ids)
            n_chars = len(text)
            text = text[s[1]:]
            s[1] = n_chars
            logprobs = seq.logprobs
            if logprobs is not None:
                n_lp = len(logprobs)
                logprobs = logprobs[s[2]:]
                s[2] = n_lp
            cumulative_logprob = seq.cumulative_logprob if with_logprobs else None
            if i == len(samples):
                samples.append([token_ids, [text], logprobs, cumulative_logprob, seq.finish_reason, seq.stop_reason])
                continue
            smp = samples[i]
            if token_ids:
                smp[0] += token_ids
            if text:
                smp[1].append(text)
            if logprobs is not None:
                if smp[2] is None:
                    smp[2] = logprobs
                else:
                    smp[2] += logprobs
            smp[3] = cumulative_logprob
            smp[4] = seq.finish_reason
            smp[5] = seq.stop_reason
        finished = finished or request.error is not None
        e[0] = finished
        e[1] = request.error
        if finished:
            self.requests.pop(request.request_id, None)
        return finished

    # -- observability ------------------------------------------------------------------
    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=bm.usage,
            num_preemptions_total=self.scheduler.num_preemptions_total,
            prefix_cache_queries_total=bm.prefix_queries,
            prefix_cache_hits_total=bm.prefix_hits,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
        )

    def kv_waste(self) -> float:
        """Fraction of allocated KV slots of running sequences that hold no token."""
        allocated, wasted = self.block_manager.slot_waste(self.scheduler.running)
        return wasted / allocated if allocated else 0.0


def validate_request(prompt_token_ids: list[int], params: SamplingParams, *, vocab_size: int, max_model_len: int,
                     block_size: int, num_blocks: int) -> int:
    """The engine's request check from its limits alone (no engine needed: the server's process mode runs it
    without the model); ValueError on a bad request, else the resolved max_tokens."""
    params.validate()
    n_prompt = len(prompt_token_ids)
    if n_prompt == 0:
        raise ValueError("the prompt is empty: at least one token is needed")
    if (not all(map(isinstance, prompt_token_ids, repeat(int)))  # C loops: this runs twice per request served
            or min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab_size):
        raise ValueError(f"prompt token ids must be integers in [0, {vocab_size})")
    if n_prompt >= max_model_len:
        raise ValueError(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
            f"has {n_prompt} tokens, leaving no room for output."
        )
    max_tokens = params.max_tokens if params.max_tokens is not None else max_model_len - n_prompt
    if n_prompt + max_tokens > max_model_len:
        raise ValueError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} for the completion)."
        )
    needed = -(-(n_prompt + max_tokens) // block_size)
    if needed > num_blocks:
        raise ValueError(
            f"the request needs up to {needed} KV-cache blocks ({n_prompt + max_tokens} tokens) but the pool "
            f"holds {num_blocks}; lower max_tokens or raise --max-num-blocks"
        )
    return max_tokens


def _max_model_len(config: EngineConfig, hf_config) -> int:
    limit = getattr(hf_config, "max_position_embeddings", None) or 2048
    window = getattr(hf_config, "sliding_window", None)
    if window and getattr(hf_config, "use_sliding_window", True):
        limit = min(limit, window)  # no sliding-window attention: stay exact by staying inside it
    if config.max_model_len is None:
        return limit
    if config.max_model_len > limit:
        raise ValueError(f"max_model_len={config.max_model_len} exceeds the model's context length {limit}")
    return config.max_model_len


def _generation_eos_ids(folder) -> list[int]:
    import json

    path = folder / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


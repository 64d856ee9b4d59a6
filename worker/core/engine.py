"""The engine core: requests in, one scheduler step at a time, one `RequestDelta` per request that progressed
out (`step_deltas`; `step` adds them up into vLLM-like cumulative `RequestOutput`s for direct callers).

Single-threaded by design: `add_request`, `abort_request` and the steps are called from one thread (the busy
loop of `hetero_infer.worker.core.busy_loop`, on the server's engine thread or in the engine process; `LLM`
calls them directly).
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from dataclasses import dataclass, field, replace
from typing import Any

from hetero_infer.contracts.engine_options import EngineConfig, batch_token_budget
from hetero_infer.contracts.kv_events import KVEventsConfig
from hetero_infer.contracts.lora import LoRAAdapterError, LoRARequest
from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.contracts.step import SamplingRow, sample_seed
from hetero_infer.contracts.tokenizer import eos_token_ids, load_tokenizer
from hetero_infer.worker.core.block_manager import BlockManager
from hetero_infer.worker.core.detokenizer import DeltaDetokenizer, IncrementalDetokenizer
from hetero_infer.worker.core.kv_events import KVEventPublisher
from hetero_infer.worker.core.lora import LoRARegistry, adapter_names
from hetero_infer.worker.core.outputs import OutputAccumulator, RequestDelta, RequestOutput, SampleDelta
from hetero_infer.worker.core.request_check import EngineLimits, check_request
from hetero_infer.worker.core.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from hetero_infer.worker.core.sequence import PLACEHOLDER, Sequence, SequenceStatus
from hetero_infer.worker.core.stats import ITERATION_TOKENS_BUCKETS, EngineStats
from hetero_infer.worker.core.step_plan import launch_step
from hetero_infer.worker.runner.executors import ExecutorDeadError, ModelFiles, executor_kind
from hetero_infer.worker.runner.loader import (
    load_hf_config,
    resolve_engine_model,
    served_name,
    serving_fields,
)
from hetero_infer.worker.runner.sampler import takes_argmax
from hetero_infer.worker.structured import GrammarCache, tokenizer_info_from_hf
from hetero_infer.worker.structured.mask import grammar_bitmasks

log = logging.getLogger(__name__)
_FINISHED = SequenceStatus.FINISHED


@dataclass(slots=True)
class _Inflight:
    """A launched step: the sequences it samples (in the order of its rows), where each one's PLACEHOLDER sits
    in its token_ids, the executor's handle, and whether the next step must wait for its tokens on the host."""

    sched: SchedulerOutput
    rows: list[Sequence]
    positions: list[int]
    handle: Any
    needs_host_tokens: bool


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
    # Per sample, what earlier deltas already carried: [end of its tokens in token_ids, logprobs entries].
    sent: list[list[int]] = field(default_factory=list)
    # with `prompt_logprobs`: the entries the steps have handed back so far, until the first delta carries them
    # all (runner/prompt_logprobs.py)
    prompt_logprobs: list[dict[int, float] | None] | None = None
    prompt_logprob_ranks: list[int | None] | None = None  # beside them: the prompt tokens' ranks

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)


def with_batch_budget(config: EngineConfig, offline: bool = False) -> EngineConfig:
    """`config` with `max_num_batched_tokens` chosen for its device when it is unset (`batch_token_budget`)."""
    if config.max_num_batched_tokens is not None:
        return config
    if not executor_kind(config.executor).runs_model:  # the mock: no device to size it for
        budget = batch_token_budget("cpu")
    else:
        from hetero_infer.worker.runner.executor import device_description

        budget = batch_token_budget(*device_description(config.device), offline=offline)
    return replace(config, max_num_batched_tokens=budget)


class LLMEngine:
    """`offline`: generation for a caller that waits for whole results (`LLM`, benchmarks) rather than a server's
    streams; only the default step budget depends on it (`batch_token_budget`)."""

    def __init__(self, config: EngineConfig, *, offline: bool = False) -> None:
        config = with_batch_budget(config, offline)
        self.config = config
        started = time.perf_counter()
        folder, name = resolve_engine_model(config)
        log.info("model %s: %s (resolved in %.1f s)", name, folder, time.perf_counter() - started)
        self.model_name = served_name(config, name)
        kind = executor_kind(config.executor)
        # an executor that runs no model (the mock): config.json's own fields where they are the config class's
        hf_config = (None if kind.runs_model else serving_fields(folder)) or load_hf_config(folder)
        self.max_model_len = _max_model_len(config, hf_config)
        self.tokenizer = load_tokenizer(folder, config.skip_tokenizer_init)  # None: token ids in and out
        log.info("config and tokenizer loaded (%.1f s so far)", time.perf_counter() - started)
        self.executor = kind.create(config, ModelFiles(
            folder, hf_config, self.max_model_len, self.tokenizer.vocab_size if self.tokenizer is not None else None))
        self.vocab_size = self.executor.vocab_size
        log.info("engine ready in %.1f s: executor %s, %d KV blocks of %d tokens", time.perf_counter() - started,
                 config.executor, self.executor.num_blocks, config.block_size)
        events = KVEventsConfig.parse(config.kv_events_config) if config.kv_events_config else None
        self.kv_events = KVEventPublisher(events) if events is not None and events.enable_kv_cache_events else None
        self.block_manager = BlockManager(self.executor.num_blocks, config.block_size, config.enable_prefix_caching,
                                          host_blocks=self.executor.num_host_blocks,
                                          record_events=self.kv_events is not None)
        self.scheduler = Scheduler(
            self.block_manager, config.max_num_seqs, config.max_num_batched_tokens, config.memory_threshold,
            config.scheduling_policy, config.max_loras if config.enable_lora else None,
        )
        self.scheduler.defer_restored = bool(getattr(self.executor, "tier_copies_async", False))
        self.eos_token_ids = sorted(eos_token_ids(folder, hf_config, self.tokenizer))
        self._eos = frozenset(self.eos_token_ids)
        # the overlap: step N+1 is launched before step N's tokens reach the host (`_step`)
        self._overlap = config.async_scheduling and self.executor.overlaps
        self._inflight: _Inflight | None = None
        self._finished_seq_ids: list[int] = []  # ended since the last launch: the next step tells the executor
        self._text = DeltaDetokenizer(self.tokenizer)  # `step()`'s output text
        # structured outputs: built on the first constrained request (EOS only where the grammar is complete)
        self.grammars = GrammarCache(
            lambda: tokenizer_info_from_hf(self.tokenizer.hf, int(self.vocab_size), self.eos_token_ids))
        self.requests: dict[str, Request] = {}
        self.prompt_tokens_total = 0
        self.last_schedule: SchedulerOutput | None = None  # for benchmarks and tracing
        self.last_schedule_seconds = 0.0
        self._iteration_tokens = [0] * (len(ITERATION_TOKENS_BUCKETS) + 1)
        self._iteration_tokens_sum = 0
        self.generation_tokens_total = 0
        self._accumulators: dict[str, OutputAccumulator] = {}  # `step()`'s cumulative outputs
        self.limits = EngineLimits(self.model_name, self.max_model_len, int(self.vocab_size),
                                   self.block_manager.num_blocks, self.block_manager.block_size,
                                   tuple(self.eos_token_ids), has_tokenizer=self.tokenizer is not None,
                                   kv_events=self.kv_events.address if self.kv_events is not None else None)
        self.loras = (LoRARegistry(self.executor, config.lora_cache_size, self._loras_in_use, self.model_name)
                      if config.enable_lora else None)

    # -- requests -----------------------------------------------------------------------
    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """`check_request` against this engine's limits (RequestError); the resolved max_tokens."""
        return check_request(prompt_token_ids, params, self.limits)

    def add_request(
        self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams,
        *, max_tokens: int | None = None, arrival_time: float | None = None,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Queue a request. `max_tokens`: the resolved max_tokens of a request its caller has checked already
        (`check_request`); without it the request is checked here (RequestError). `lora_request`: the LoRA
        adapter it runs with, loaded here if it is not (LoRAAdapterError; None: the base model)."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if max_tokens is None:
            max_tokens = self.check_request(prompt_token_ids, params)
        if lora_request is not None:
            self.add_lora(lora_request)
        # vLLM V1's fan-out: one sequence per sample, each scheduled on its own (so each counts against
        # max_num_seqs); the later ones take the first one's prompt blocks from the prefix cache
        seqs = [self._new_sequence(request_id, list(prompt_token_ids), params, max_tokens, i)
                for i in range(num_samples(params))]
        for seq in seqs[1:]:
            seq.prompt_leader = seqs[0]
        if lora_request is not None:
            for seq in seqs:
                seq.lora_name, seq.lora_id = lora_request.lora_name, lora_request.lora_int_id
            self.loras.counted(lora_request.lora_name)
        request = Request(request_id, prompt, list(prompt_token_ids), params, seqs)
        if arrival_time is not None:
            request.arrival_time = arrival_time
        if params.prompt_logprobs is not None:  # the first sample's prefill steps compute them
            request.prompt_logprobs, request.prompt_logprob_ranks = [None], [None]
            if len(prompt_token_ids) > 1:
                seqs[0].prompt_logprobs_top = params.prompt_logprobs
        self.requests[request_id] = request
        for seq in seqs:
            self.scheduler.add(seq)

    def _new_sequence(self, request_id, token_ids, params, max_tokens, sample_index) -> Sequence:
        seq = Sequence(request_id, token_ids, len(token_ids), params, max_tokens, sample_index)
        if params.seed is not None:  # (its generator is the executor's: `SamplingRow.seed`)
            seq.seed = sample_seed(params.seed, sample_index)
        # best_of > n ranks the samples by cumulative logprob, so the sampler computes one for every token
        seq.sampler_params = params
        if num_samples(params) > params.n and params.logprobs is None:
            seq.sampler_params = replace(params, logprobs=0)
        if params.stop_strings:  # the only detokenizing the engine does: stop strings end sequences exactly
            seq.stop_checker = IncrementalDetokenizer(self.tokenizer, token_ids, params)
        if params.structured_outputs is not None:
            seq.grammar = self.grammars.new_state(params.structured_outputs)
        return seq

    # -- LoRA adapters --------------------------------------------------------------------
    def _lora_registry(self) -> LoRARegistry:
        if self.loras is None:
            raise LoRAAdapterError("LoRA adapters are not enabled: start the engine with enable_lora=True "
                                   "(--enable-lora)")
        return self.loras

    def add_lora(self, lora_request: LoRARequest) -> None:
        """Read and check a LoRA adapter into host memory (a no-op for one loaded already); LoRAAdapterError, and
        nothing changed, for a bad one (worker/core/lora.py)."""
        self._lora_registry().add(lora_request)

    def remove_lora(self, lora_name: str) -> bool:
        """Unload an adapter (False: none of that name is loaded); its running requests finish with it."""
        return self._lora_registry().remove(lora_name)

    def list_loras(self) -> list[LoRARequest]:
        return [] if self.loras is None else self.loras.list()

    def _loras_in_use(self) -> set[str]:
        return {s.lora_name for r in self.requests.values() for s in r.seqs
                if s.lora_name is not None and not s.is_finished}

    def abort_request(self, request_id: str) -> None:
        request = self.requests.pop(request_id, None)
        if self._accumulators.pop(request_id, None) is not None:
            self._text.drop(request_id)
        if request is None:
            return
        for seq in request.seqs:
            seq.grammar = None
            if not seq.is_finished:
                self._end(seq, "abort")

    def _end(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        """Finish a sequence (its blocks freed at once); the executor hears of it with the next step."""
        self.scheduler.finish(seq, reason, stop_reason)
        self._finished_seq_ids.append(seq.seq_id)

    # -- the step -----------------------------------------------------------------------
    def step_deltas(self) -> list[RequestDelta]:
        """One scheduler step; a delta (token ids, no text: the frontend detokenizes) for every request that got
        new tokens (or failed). With the overlap, the tokens are those of the step before: see `_step`."""
        touched = self._step()
        if not touched:
            return []
        step_end = time.monotonic()
        return [self._delta(r, step_end) for r in touched]

    def step(self) -> list[RequestOutput]:
        """One scheduler step; the cumulative output of every request that got new tokens (or failed) in it, its
        text detokenized here (the in-process frontend of direct callers such as `LLM`)."""
        touched = self._step()
        if not touched:
            return []
        step_end = time.monotonic()
        outputs = []
        accumulators = self._accumulators
        for request in touched:
            rid = request.request_id
            acc = accumulators.get(rid)
            if acc is None:
                acc = accumulators[rid] = OutputAccumulator(rid, request.prompt, request.prompt_token_ids,
                                                            request.arrival_time)
                self._text.add(rid, request.prompt_token_ids, request.params)
            delta = self._delta(request, step_end)
            self._text.fill(delta)
            acc.add(delta)
            if acc.finished:
                del accumulators[rid]
            outputs.append(acc.output())
        return outputs

    def has_unfinished_requests(self) -> bool:
        # a step still in flight when the last request ends has only finished sequences: nothing to wait for
        return bool(self.requests)

    def _step(self) -> list[Request]:
        """Schedule and launch step N+1, then finish step N: while the device runs N+1, the host takes N's tokens
        (N+1 got them on the device: the scheduler counted a PLACEHOLDER for each). The requests that got new
        tokens (or failed). A step whose sequences need their tokens on the host before the next can be built
        (grammars, logits processors) is finished first; so is every step of an executor that does
        not overlap (or with async_scheduling off), in the call that launched it."""
        touched: list[Request] = []
        joined = 0  # lists of touched requests joined into `touched` (each holds a request once)
        if self.loras is not None and self.loras.needs_drain:
            self.loras.drain()
        prev, self._inflight = self._inflight, None
        if prev is not None and prev.needs_host_tokens:
            touched += self._finish(prev)
            joined += 1
            prev = None
        t = time.perf_counter()
        sched = self.scheduler.schedule()
        self.last_schedule_seconds = time.perf_counter() - t
        self.last_schedule = sched
        step = None
        if sched.scheduled:
            n = sched.num_tokens
            self._iteration_tokens[bisect_left(ITERATION_TOKENS_BUCKETS, n)] += 1
            self._iteration_tokens_sum += n
            try:
                step = self._launch(sched)
            except ExecutorDeadError:  # no step can run any more: the engine stops
                raise
            except Exception as exc:  # one bad step fails only its own requests
                log.exception("engine step failed; failing the %d requests in it", len(sched.scheduled))
                failing = list(sched.scheduled)
                if sched.block_moves:  # their copies may not have been made: no block may claim their contents
                    self.block_manager.discard_moves(sched.block_moves)
                    failing += self._restored_behind(sched)
                touched += self._fail_step(failing, f"{type(exc).__name__}: {exc}")
                joined += 1
        if prev is not None:
            touched += self._finish(prev)
            joined += 1
        if step is not None:
            if self._overlap:
                self._inflight = step
            else:
                touched += self._finish(step)
                joined += 1
        if joined > 1 and len(touched) > 1:
            touched = list(dict.fromkeys(touched))
        if self.kv_events is not None:
            self.kv_events.publish(self.block_manager.take_events())
        return touched

    def _launch(self, sched: SchedulerOutput) -> _Inflight:
        """Hand the step to the executor as the step contract, its work counted as done on the sequences (computed
        tokens, a PLACEHOLDER per sampled token) so that the next step can be scheduled before this one ends."""
        plan, rows, first = launch_step(sched, self._finished_seq_ids)
        if first:
            now = time.monotonic()
            requests = self.requests
            for seq in first:
                request = requests[seq.request_id]
                if request.first_scheduled_time is None:
                    request.first_scheduled_time = now
        sampling = None
        needs_host_tokens = False
        if not self.executor.samples_itself:
            sampling, needs_host_tokens = self._sampling_rows(rows)
        handle = self.executor.execute_async(plan, sampling)
        self._finished_seq_ids = []  # (the plan holds the old list: told once, unless the launch failed)
        positions = []
        for seq in rows:
            tokens = seq.token_ids
            positions.append(len(tokens))
            tokens.append(PLACEHOLDER)
            seq.num_pending += 1
        return _Inflight(sched, rows, positions, handle, needs_host_tokens)

    def _sampling_rows(self, rows: list[Sequence]) -> tuple[list[SamplingRow] | None, bool]:
        """What the executor's sampler needs for `rows` (None: every row takes its argmax), and whether the host
        must have these rows' tokens before the next step is built (the next step's grammar masks or logits
        processors read them; penalties count a token still on the device from there: `PendingTokens`)."""
        if all(takes_argmax(s.sampler_params, s.num_output_tokens, s.grammar) and not s.params.logits_processors
               for s in rows):  # all greedy, nothing to process (the usual step): no SamplingRows either
            return None, False
        eos = self.eos_token_ids
        sampling = [SamplingRow(s.sampler_params, s.token_ids[: s.num_prompt_tokens], s.output_token_ids,
                                None, eos, None, s.seed) for s in rows]
        constrained = [j for j, s in enumerate(rows) if s.grammar is not None]
        if constrained:  # the grammars' next tokens, as data (the matchers stay here, advanced by `_accept`)
            masks = grammar_bitmasks([rows[j].grammar for j in constrained],
                                     [sampling[j].output_token_ids for j in constrained], int(self.vocab_size))
            for j, mask in zip(constrained, masks, strict=True):
                sampling[j].token_bitmask = mask
        feedback = bool(constrained) or any(s.params.logits_processors for s in rows)
        return sampling, feedback

    def _finish(self, step: _Inflight) -> list[Request]:
        """Wait for a launched step's tokens and apply them: the requests that got new tokens (or failed)."""
        try:
            token_ids, sampled = step.handle.result()
        except Exception as exc:
            log.exception("engine step failed; failing the %d requests in it", len(step.sched.scheduled))
            return self._fail_step(step.sched.scheduled, f"{type(exc).__name__}: {exc}")
        requests = self.requests
        for request_id, entries, ranks in step.handle.prompt_logprobs or ():
            request = requests.get(request_id)  # None: aborted while the step ran
            if request is not None:
                request.prompt_logprobs += entries
                request.prompt_logprob_ranks += ranks
        live = []  # rows whose sequence still runs (else stopped or aborted while this step ran: token dropped)
        for i, (seq, index) in enumerate(zip(step.rows, step.positions)):
            if seq.status is not _FINISHED:
                seq.token_ids[index] = token_ids[i]
                seq.num_pending -= 1
                live.append(i)
        # Offer the blocks completed so far to the prefix cache, now that their tokens are known, and before the
        # new tokens may end their sequences (the step in flight may have computed some: the device runs it
        # before any step that could take them from the cache).
        bm = self.block_manager
        if bm.enable_prefix_caching:
            register, block_size = bm.register_computed_blocks, bm.block_size
            for item in step.sched.scheduled:
                seq = item.seq
                if seq.status is not _FINISHED and seq.num_computed_tokens // block_size > seq.num_registered_blocks:
                    register(seq)
        now = time.monotonic()
        touched: dict[str, Request] = {}
        accept = self._accept
        self.generation_tokens_total += len(live)
        for i in live:
            seq, index = step.rows[i], step.positions[i]
            request = requests[seq.request_id]
            touched[request.request_id] = request
            if request.first_token_time is None:
                request.first_token_time = now
            accept(seq, index, token_ids[i], None if sampled is None else sampled[i])
            if seq.status is _FINISHED:
                del seq.token_ids[index + 1:]  # the placeholder of a step in flight, if any
                seq.num_pending = 0
                if seq.grammar is not None:
                    seq.grammar = None  # the matcher ends with its sequence (last_schedule still holds it)
        return list(touched.values())

    def _accept(self, seq: Sequence, index: int, token_id: int, sampled) -> None:
        """Apply the token at `index` of `seq`: logprobs, grammar, and the stop rules (EOS, stop tokens, stop
        strings, max_tokens, the context length)."""
        num_output = index + 1 - seq.num_prompt_tokens
        if num_output == 1:
            self.prompt_tokens_total += seq.num_prompt_tokens if seq.sample_index == 0 else 0
        if sampled is not None and sampled.logprob is not None:
            seq.cumulative_logprob += sampled.logprob
            if seq.params.logprobs is not None:
                if seq.logprobs is None:
                    seq.logprobs = []
                seq.logprobs.append(sampled.top_logprobs or {token_id: sampled.logprob})
        params = seq.params
        if seq.grammar is not None and not seq.grammar.accept(token_id):
            log.warning("request %s: token %d is outside its grammar; finishing it", seq.request_id, token_id)
            return self._end(seq, "abort")
        if num_output >= params.min_tokens:
            eos = not params.ignore_eos and token_id in self._eos
            if eos or token_id in params.stop_token_ids:
                # as vLLM: the stop token stays in token_ids, its text only with include_stop_str_in_output
                return self._end(seq, "stop", None if eos else token_id)
        checker = seq.stop_checker
        if checker is not None:
            stop_str = checker.add_token(token_id)
            if stop_str is not None and num_output >= params.min_tokens:
                return self._end(seq, "stop", stop_str)
        if seq.grammar is not None and seq.grammar.is_terminated:
            return self._end(seq, "stop")  # the grammar's EOS under ignore_eos: nothing may follow
        if num_output >= seq.max_tokens or index + 1 >= self.max_model_len:
            self._end(seq, "length")

    def _restored_behind(self, sched: SchedulerOutput) -> list[ScheduledSeq]:
        """The running sequences not in `sched` that hold blocks it restores (the scheduler deferred them to the next
        step): their tokens in those blocks may never have been copied."""
        restored = {block for _, block in sched.block_moves.restores} if sched.block_moves else set()
        if not restored:
            return []
        scheduled = {item.seq.seq_id for item in sched.scheduled}
        return [ScheduledSeq(seq, 0) for seq in self.scheduler.running
                if seq.seq_id not in scheduled and not restored.isdisjoint(seq.block_table)]

    def _fail_step(self, scheduled: list, message: str) -> list[Request]:
        failed: dict[str, Request] = {}
        for item in scheduled:
            request = self.requests.get(item.seq.request_id)
            if request is not None:
                failed[request.request_id] = request
        for request in failed.values():
            request.error = message
            for seq in request.seqs:
                if not seq.is_finished:
                    seq.grammar = None
                    self._end(seq, "error")
        return list(failed.values())

    def _delta(self, request: Request, step_end: float) -> RequestDelta:
        """What `request` gained since its previous delta (the only place deltas are cut): token ids, logprobs,
        finish and stop reasons; the text is left to the frontend (`DeltaDetokenizer`)."""
        params = request.params
        seqs = request.seqs
        sent = request.sent
        with_logprobs = params.logprobs is not None
        if len(seqs) == 1:  # (one sample: the usual request, without the loop)
            seq = seqs[0]
            finished = seq.status is _FINISHED or request.error is not None
            if not sent:
                sent.append([seq.num_prompt_tokens, 0])
            samples = [self._sample_delta(seq, sent[0], with_logprobs)]
        else:
            finished = request.error is not None or all(s.status is _FINISHED for s in seqs)
            if len(seqs) > params.n:  # best_of: nothing until the end, then the n best as samples 0..n-1
                seqs = _best(seqs, params.n) if finished else []
            samples = []
            for i, seq in enumerate(seqs):
                if i == len(sent):
                    sent.append([seq.num_prompt_tokens, 0])
                samples.append(self._sample_delta(seq, sent[i], with_logprobs))
        if finished:
            self.requests.pop(request.request_id, None)
        prompt_logprobs = ranks = None
        if request.prompt_logprobs is not None and len(request.prompt_logprobs) == len(request.prompt_token_ids):
            # sent once, whole, with the first delta (before any sample's tokens)
            prompt_logprobs, request.prompt_logprobs = request.prompt_logprobs, None
            ranks, request.prompt_logprob_ranks = request.prompt_logprob_ranks, None
        return RequestDelta(request.request_id, samples, finished, request.error, [step_end],
                            request.first_scheduled_time, request.first_token_time,
                            request.seqs[0].num_cached_tokens, prompt_logprobs, ranks)

    @staticmethod
    def _sample_delta(seq: Sequence, sent: list[int], with_logprobs: bool) -> SampleDelta:
        """What `seq` gained since `sent` ([end of its tokens in token_ids, logprobs entries] sent so far), which
        moves past it."""
        tokens = seq.token_ids
        known = len(tokens) - seq.num_pending
        token_ids = tokens[sent[0]:known]
        sent[0] = known
        logprobs = seq.logprobs
        if logprobs is not None:
            n_lp = len(logprobs)
            logprobs = logprobs[sent[1]:]
            sent[1] = n_lp
        return SampleDelta(token_ids, "", logprobs, seq.cumulative_logprob if with_logprobs else None,
                           seq.finish_reason, seq.stop_reason)

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
            iteration_tokens=tuple(self._iteration_tokens),
            iteration_tokens_sum=self._iteration_tokens_sum,
            **self._host_tier_stats(),
            **self._lora_stats(),
        )

    def _lora_stats(self) -> dict[str, Any]:
        loras = self.loras
        if loras is None:
            return {}
        active: dict[str, int] = {}
        for r in self.requests.values():
            name = r.seqs[0].lora_name
            if name is not None:
                active[name] = active.get(name, 0) + 1
        return {"max_lora": self.config.max_loras, "running_lora_adapters": adapter_names(self.scheduler.running),
                "waiting_lora_adapters": adapter_names(self.scheduler.waiting), "lora_requests": active,
                "lora_requests_total": dict(loras.requests_total), "loras": tuple(loras.list())}

    def _host_tier_stats(self) -> dict[str, float]:
        bm = self.block_manager
        if bm.host is None:
            return {}
        block_bytes = self.executor.block_bytes
        return {"host_kv_cache_usage": bm.host.usage, "host_prefix_cache_queries_total": bm.host_queries,
                "host_prefix_cache_hits_total": bm.host_hits,
                "host_kv_bytes_saved_total": bm.blocks_saved * block_bytes,
                "host_kv_bytes_restored_total": bm.blocks_restored * block_bytes}

    def kv_waste(self) -> float:
        """Fraction of allocated KV slots of running sequences that hold no token."""
        allocated, wasted = self.block_manager.slot_waste(self.scheduler.running)
        return wasted / allocated if allocated else 0.0


def num_samples(params: SamplingParams) -> int:
    """How many sequences a request samples: `best_of` when given, else `n`."""
    return params.best_of or params.n


def _best(seqs: list[Sequence], n: int) -> list[Sequence]:
    """vLLM's best_of rule: the n samples with the highest cumulative logprob, best first (ties: lower index)."""
    return sorted(seqs, key=lambda s: -s.cumulative_logprob)[:n]


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

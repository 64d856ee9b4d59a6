"""The LoRA API (phase one of issue 39): LoRARequest and the engine options, adapters read and refused with the
same clear errors by every executor, the block hash chain keyed by adapter (worker and router alike), the
scheduler's slot limit, and the mock executor's path through `LLM` and the engine clients."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import struct

import pytest
from lora_testing import edit_adapter_config, other_base

from hetero_infer import LLM, LoRARequest, SamplingParams
from hetero_infer.contracts.block_hashes import ROOT, block_hashes, chain_hash
from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.lora import LoRAAdapterError
from hetero_infer.contracts.options import InvalidOption

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def mock_llm(folder, **kw) -> LLM:
    return LLM(str(folder), executor="mock", enable_lora=True, block_size=4, **kw)


# -- the contract -------------------------------------------------------------------------------------------
def test_lora_request_fields_and_checks():
    r = LoRARequest("sql", 1, "/adapters/sql")
    assert (r.lora_name, r.lora_int_id, r.lora_path, r.base_model_name) == ("sql", 1, "/adapters/sql", None)
    assert (r.name, r.adapter_id, r.path) == ("sql", 1, "/adapters/sql")  # vLLM's accessors
    assert r == LoRARequest("sql", 1, "/adapters/sql") and hash(r) == hash(LoRARequest("sql", 1, "/adapters/sql"))
    with pytest.raises(LoRAAdapterError, match="lora_name"):
        LoRARequest("", 1, "/x")
    with pytest.raises(LoRAAdapterError, match="lora_int_id"):
        LoRARequest("a", 0, "/x")
    assert issubclass(LoRAAdapterError, ValueError)


@pytest.mark.parametrize("bad, what", [
    ({"max_loras": 0}, "max_loras"), ({"max_lora_rank": 0}, "max_lora_rank"), ({"max_lora_rank": 1024}, "max_lora_rank"),
    ({"max_loras": 4, "max_cpu_loras": 2}, "max_cpu_loras"), ({"enable_lora": True, "tensor_parallel_size": 2}, "enable_lora"),
])
def test_engine_options_checked(bad, what):
    with pytest.raises(InvalidOption, match=what):
        EngineConfig(**bad)


def test_engine_options_defaults():
    c = EngineConfig()
    assert (c.enable_lora, c.max_loras, c.max_lora_rank, c.max_cpu_loras, c.lora_cache_size) == (False, 1, 16, None, 1)
    assert EngineConfig(max_loras=3, max_cpu_loras=5).lora_cache_size == 5


# -- block hashes -------------------------------------------------------------------------------------------
def test_base_hashes_unchanged_and_adapters_apart():
    tokens = list(range(40, 72))
    # the base chain as it always was: BLAKE2b-64 of the parent and the packed tokens, from ROOT
    parent, expected = ROOT, []
    for i in range(0, 32, 8):
        parent = hashlib.blake2b(parent + struct.pack("<8q", *tokens[i:i + 8]), digest_size=8).digest()
        expected.append(int.from_bytes(parent, "little"))
    assert block_hashes(tokens, 8) == expected == block_hashes(tokens, 8, None)
    a, b = block_hashes(tokens, 8, "sql"), block_hashes(tokens, 8, "chat")
    assert len(set(a) | set(b) | set(expected)) == 12  # nothing shared across adapters or with the base
    assert a == block_hashes(tokens, 8, "sql")
    assert a[0] == chain_hash(None, tokens[:8], "sql") and a[1] == chain_hash(a[0], tokens[8:16])


def test_router_hashes_prompts_as_the_worker_does(tiny_model):
    from hetero_infer.router.prompt import request_hashes

    folder, _ = tiny_model("llama")
    llm = mock_llm(folder, max_loras=2)
    prompt = list(range(100, 121))
    lora = LoRARequest("sql", 1, str(_adapter_folder(folder)))
    llm.generate(prompt_token_ids=[prompt], sampling_params=GREEDY, lora_request=lora)
    cached = set(llm.engine.block_manager.hash_to_block)
    routed, exact = request_hashes({"prompt": prompt}, None, 4, 64, adapter="sql")
    assert exact and set(routed) <= cached and len(routed) == 5
    assert not set(request_hashes({"prompt": prompt}, None, 4, 64)[0]) & cached


# -- adapters read and refused --------------------------------------------------------------------------------
_made: dict = {}


def _adapter_folder(model_folder):
    """An adapter of the tiny llama (made by peft), shared by the tests of this module."""
    return _made[model_folder]


@pytest.fixture(autouse=True)
def _adapters(tiny_model, adapter):
    folder, _ = tiny_model("llama")
    _made.setdefault(folder, adapter("llama", "attn8"))


@pytest.fixture(params=["mock", "torch"])
def engine_kind(request):
    return request.param


def _broken(tmp_path, src, name, how):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    how(dst)
    return dst


BAD = {
    "rank": ("rank 8 .*> max_lora_rank 4", lambda d: None, {"max_lora_rank": 4}),
    "no_config": ("no adapter_config.json", lambda d: (d / "adapter_config.json").unlink(), {}),
    "no_weights": ("no weights", lambda d: (d / "adapter_model.safetensors").unlink(), {}),
    "target": ("target module 'c_attn' is not in the model",
               lambda d: edit_adapter_config(d, target_modules=["q_proj", "c_attn"]), {}),
    "dora": ("DoRA", lambda d: edit_adapter_config(d, use_dora=True), {}),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_adapters_refused_and_nothing_changes(case, tmp_path, tiny_model, engine_kind):
    folder, _ = tiny_model("llama")
    message, how, options = BAD[case]
    bad = _broken(tmp_path, _adapter_folder(folder), case, how)
    llm = LLM(str(folder), executor=engine_kind, enable_lora=True, device="cpu", **options)
    good = LoRARequest("good", 1, str(_adapter_folder(folder)))
    if options.get("max_lora_rank", 16) >= 8:
        llm.add_lora(good)
    before = llm.list_loras()
    with pytest.raises(LoRAAdapterError, match=message):
        llm.add_lora(LoRARequest("bad", 2, str(bad)))
    with pytest.raises(LoRAAdapterError, match=message):  # named by a request: refused before any work
        llm.generate(prompt_token_ids=[[1, 2, 3], [4, 5, 6]], sampling_params=GREEDY,
                     lora_request=[None, LoRARequest("bad", 2, str(bad))])
    assert llm.list_loras() == before
    assert not llm.engine.requests and llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_adapter_for_another_base_refused(tiny_model, tmp_path):
    folder, _ = tiny_model("llama")
    llm = mock_llm(other_base(folder, tmp_path / "wide"))
    with pytest.raises(LoRAAdapterError, match="input size 128 != the model's 96"):
        llm.add_lora(LoRARequest("narrow", 1, str(_adapter_folder(folder))))
    with pytest.raises(LoRAAdapterError, match="is for base model 'other'"):
        llm.add_lora(LoRARequest("x", 1, str(_adapter_folder(folder)), base_model_name="other"))
    assert llm.list_loras() == []


def test_duplicate_names_and_ids_refused(tiny_model):
    folder, _ = tiny_model("llama")
    path = str(_adapter_folder(folder))
    llm = mock_llm(folder, max_loras=2)
    first = LoRARequest("a", 1, path)
    llm.add_lora(first)
    llm.add_lora(first)  # the same adapter again: a no-op
    with pytest.raises(LoRAAdapterError, match="named 'a' is already loaded"):
        llm.add_lora(LoRARequest("a", 2, path))
    with pytest.raises(LoRAAdapterError, match="lora_int_id 1 is already used"):
        llm.add_lora(LoRARequest("b", 1, path))
    assert llm.list_loras() == [first]
    assert llm.remove_lora("a") and not llm.remove_lora("a") and llm.list_loras() == []


def test_lora_needs_enable_lora(tiny_model):
    folder, _ = tiny_model("llama")
    llm = LLM(str(folder), executor="mock")
    with pytest.raises(LoRAAdapterError, match="enable_lora=True"):
        llm.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=GREEDY,
                     lora_request=LoRARequest("a", 1, str(_adapter_folder(folder))))


# -- the mock executor through LLM ----------------------------------------------------------------------------
def _loras(folder, n):
    return [LoRARequest(f"ad{i}", i + 1, str(_adapter_folder(folder))) for i in range(n)]


def test_mock_adapter_outputs_differ_from_base_and_do_not_depend_on_the_batch(tiny_model):
    folder, _ = tiny_model("llama")
    a, b = _loras(folder, 2)
    prompt = [[5, 6, 7, 8, 9]]
    alone = {}
    for lora in (None, a, b):
        llm = mock_llm(folder, max_loras=2)
        alone[lora] = llm.generate(prompt_token_ids=prompt, sampling_params=GREEDY, lora_request=lora)[0]
    assert len({tuple(o.outputs[0].token_ids) for o in alone.values()}) == 3
    llm = mock_llm(folder, max_loras=2)
    mixed = llm.generate(prompt_token_ids=prompt * 3, sampling_params=GREEDY, lora_request=[a, None, b])
    assert [o.outputs[0].token_ids for o in mixed] == [alone[x].outputs[0].token_ids for x in (a, None, b)]


def test_scheduler_never_runs_more_adapters_than_slots(tiny_model):
    """Five adapters and the base over two slots, a small KV pool (preemption): every step holds at most two
    adapters, every request ends with the tokens it gets alone, and no block is left held."""
    folder, _ = tiny_model("llama")
    loras = _loras(folder, 5)
    llm = mock_llm(folder, max_loras=2, max_cpu_loras=3, max_num_blocks=10, max_num_batched_tokens=16)
    engine = llm.engine
    seen = []
    launch = engine.executor.execute_async

    def spy(plan, sampling):
        seen.append(set(plan.adapter_ids.values()))
        return launch(plan, sampling)

    engine.executor.execute_async = spy
    prompts = [[10 + i, 11, 12, 13, 14, 15, 16] for i in range(12)]
    per_prompt = [loras[i % 5] if i % 3 else None for i in range(12)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, lora_request=per_prompt)
    assert max(len(s) for s in seen) == 2 and len(set().union(*seen)) == 5
    assert engine.scheduler.num_preemptions_total > 0
    for prompt, lora, out in zip(prompts, per_prompt, outs):
        alone = mock_llm(folder).generate(prompt_token_ids=[prompt], sampling_params=params, lora_request=lora)[0]
        assert out.outputs[0].token_ids == alone.outputs[0].token_ids
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not engine.scheduler.running_loras
    assert len(engine.list_loras()) == 3  # back within max_cpu_loras once nothing runs


def test_fcfs_across_adapters(tiny_model):
    """One slot: the requests run in arrival order, adapter after adapter, none overtaking one that waits."""
    folder, _ = tiny_model("llama")
    a, b = _loras(folder, 2)
    llm = mock_llm(folder, max_loras=1)
    engine = llm.engine
    order = [a, b, a, None, b]
    for i, lora in enumerate(order):
        engine.add_request(f"r{i}", None, [20 + i, 21, 22], SamplingParams(max_tokens=3, ignore_eos=True),
                           lora_request=lora)
    started = []
    while engine.has_unfinished_requests():
        engine.step()
        for seq in engine.scheduler.running:
            if seq.request_id not in started:
                started.append(seq.request_id)
    # r0 (a) runs; r1 (b) waits for the slot, and r2, r3, r4 behind it even where they could run
    assert started.index("r1") < started.index("r2") < started.index("r4")
    assert started.index("r1") < started.index("r3")


def test_prefix_cache_keyed_by_adapter(tiny_model):
    folder, _ = tiny_model("llama")
    a, b = _loras(folder, 2)
    llm = mock_llm(folder, max_loras=2)
    prompt = [list(range(200, 217))]
    cached = []
    for lora in (a, b, None, a):
        out = llm.generate(prompt_token_ids=prompt, sampling_params=GREEDY, lora_request=lora)[0]
        cached.append(out.num_cached_tokens)
    assert cached == [0, 0, 0, 16]


def test_lora_stats(tiny_model):
    folder, _ = tiny_model("llama")
    a, b = _loras(folder, 2)
    llm = mock_llm(folder, max_loras=1)
    engine = llm.engine
    for i, lora in enumerate((a, b, None, a)):
        engine.add_request(f"r{i}", None, [30, 31, 32], SamplingParams(max_tokens=4, ignore_eos=True),
                           lora_request=lora)
    engine.step()
    s = engine.stats()
    assert s.max_lora == 1 and s.running_lora_adapters == ("ad0",) and s.waiting_lora_adapters == ("ad1", "ad0")
    assert s.lora_requests == {"ad0": 2, "ad1": 1} and s.lora_requests_total == {"ad0": 2, "ad1": 1}
    assert [r.lora_name for r in s.loras] == ["ad1", "ad0"]  # least recently used first; both run: over max_cpu_loras
    assert LLM(str(folder), executor="mock").engine.stats().max_lora == 0


def test_remove_while_running_finishes_first(tiny_model):
    folder, _ = tiny_model("llama")
    (a,) = _loras(folder, 1)
    engine = mock_llm(folder).engine
    engine.add_request("r", None, [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True), lora_request=a)
    engine.step()
    assert engine.remove_lora("ad0") and engine.list_loras() == []
    while engine.has_unfinished_requests():
        engine.step()  # the running request still has its adapter
    engine.step()
    assert "ad0" not in engine.executor.loras


# -- the engine clients ----------------------------------------------------------------------------------------
def test_process_client_loads_and_refuses(tiny_model, tmp_path):
    """The engine in its own process: add / remove / list cross the pipe, a bad adapter's error comes back as
    itself, and generate's lora_request reaches the engine."""
    folder, _ = tiny_model("llama")
    good = LoRARequest("good", 1, str(_adapter_folder(folder)))
    bad = LoRARequest("bad", 2, str(_broken(tmp_path, _adapter_folder(folder), "bad",
                                            lambda d: edit_adapter_config(d, target_modules=["c_attn"]))))
    with LLM(str(folder), executor="mock", enable_lora=True, engine_process=True) as llm:
        llm.add_lora(good)
        assert llm.list_loras() == [good]
        with pytest.raises(LoRAAdapterError, match="target module 'c_attn'"):
            llm.add_lora(bad)
        base, tuned = llm.generate(prompt_token_ids=[[7, 8, 9]] * 2, sampling_params=GREEDY, lora_request=[None, good])
        assert base.outputs[0].token_ids != tuned.outputs[0].token_ids
        assert llm.remove_lora("good") is True and llm.list_loras() == []
        assert llm.remove_lora("good") is False


def test_inproc_client_lora_commands(tiny_model):
    from hetero_infer.worker.core.busy_loop import EngineRequest
    from hetero_infer.worker.frontend.inproc import InprocEngineClient

    folder, _ = tiny_model("llama")
    good = LoRARequest("good", 1, str(_adapter_folder(folder)))
    engine = mock_llm(folder).engine

    async def run():
        client = InprocEngineClient(engine)
        client.start()
        try:
            await client.add_lora(good)
            assert client.list_loras() == [good]
            with pytest.raises(LoRAAdapterError, match="no such folder"):
                await client.add_lora(LoRARequest("gone", 2, "/no/such/adapter"))
            stream = client.submit([EngineRequest("q", None, [3, 4, 5], GREEDY, None, good)])
            while (outs := await stream.next()) and not outs[-1].finished:
                pass
            assert client.stats().lora_requests_total == {"good": 1}
            assert await client.remove_lora("good") is True
            assert client.list_loras() == []
        finally:
            client.shutdown()

    asyncio.run(run())

"""The overlap of host and device on a GPU (issue 24 item 3), in well under a minute: the outputs with the overlap
on and off (tiny Qwen3 shape, float32, CUDA graphs and eager; greedy, seeded sampling with n=2 and logprobs,
top-k, repetition penalty) and its timing on the Qwen3-0.6B shape in bf16 (one request of 128 + 256 tokens;
64 requests of 128 + 128), on and off alternated on the same engine. Dummy weights, token ids only.

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpucheck/whl/*.whl   # gpu_check.py prepare
    PYTHONPATH=/tmp/site:$PWD OUT=/tmp python3 benchmarks/gpu_overlap_check.py

Prints (and writes $OUT/overlap.json) what it has after each part. DEV=cpu runs the first part on the CPU with the
overlap forced (the same control flow without CUDA).
"""
import json
import os
import random
import time
import traceback

import torch

OUT = os.environ.get("OUT", "/tmp")
DEV = os.environ.get("DEV", "cuda")
res: dict = {"gpu": torch.cuda.get_device_name(0) if DEV == "cuda" else DEV, "torch": torch.__version__}


def save():
    with open(f"{OUT}/overlap.json", "w") as f:
        json.dump(res, f, indent=1, default=str)
    print(json.dumps(res, default=str)[-3000:], flush=True)


from hetero_infer import LLM, SamplingParams  # noqa: E402


def outputs(outs):
    return [[(c.token_ids, c.finish_reason) for c in o.outputs] for o in outs]


def lp(outs):
    return [[(c.logprobs, c.cumulative_logprob) for c in o.outputs] for o in outs]


t0 = time.monotonic()
try:
    import gc
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 4000) for _ in range(n)] for n in [5, 40, 17, 1, 90, 33, 8, 64]]
    params = [SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True) for _ in range(4)] + [
        SamplingParams(max_tokens=20, temperature=0.8, seed=3, n=2, logprobs=2, ignore_eos=True),
        SamplingParams(max_tokens=25, temperature=0.0, ignore_eos=True, top_k=5),
        SamplingParams(max_tokens=20, temperature=0.0, repetition_penalty=1.2, ignore_eos=True),
        SamplingParams(max_tokens=30, temperature=0.0, logprobs=1, ignore_eos=True)]
    for eager in (False, True):
        llm = LLM("benchmarks/shapes/tiny-qwen3", load_format="dummy", skip_tokenizer_init=True, device=DEV,
                  dtype="float32", enforce_eager=eager, max_num_seqs=16, max_model_len=512, max_num_blocks=512)
        eng = llm.engine
        if DEV == "cpu":
            eng.executor.overlaps = eng._overlap = True
        assert eng.executor.overlaps and eng._overlap
        got = {}
        for ov in (True, False, True):
            eng._overlap = ov
            got.setdefault(ov, []).append(llm.generate(prompt_token_ids=prompts, sampling_params=params))
        a, b, c = outputs(got[True][0]), outputs(got[False][0]), outputs(got[True][1])
        same = sum(x == y for x, y in zip(a, b))
        res[f"tiny eager={eager}"] = {"on==off requests": f"{same}/{len(a)}", "on==on": a == c,
                                      "decode graph steps": getattr(eng.executor.decode_runner, "num_steps", None),
                                      "free blocks back": eng.block_manager.num_free_blocks == eng.block_manager.num_blocks,
                                      "seconds": round(time.monotonic() - t0, 1)}
        if same != len(a):
            res[f"tiny eager={eager}"]["diff"] = [(i, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y][:2]
        save()
        del llm, eng
        gc.collect()
        torch.cuda.empty_cache()
except Exception:
    res["tiny error"] = traceback.format_exc()[-2500:]
    save()

try:
    if DEV != "cuda":
        raise SystemExit(0)
    llm = LLM("benchmarks/shapes/qwen3-0.6b", load_format="dummy", skip_tokenizer_init=True, device="cuda",
              dtype="bfloat16", max_model_len=2048, gpu_memory_utilization=0.6)
    eng = llm.engine
    res["0.6b load s"] = round(time.monotonic() - t0, 1)
    rng = random.Random(1)
    one = [[rng.randrange(10, 150000) for _ in range(128)]]
    batch = [[rng.randrange(10, 150000) for _ in range(128)] for _ in range(64)]
    g = SamplingParams(max_tokens=256, temperature=0.0, ignore_eos=True)
    for warm in (one, batch):
        llm.generate(prompt_token_ids=warm, sampling_params=SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    timing = {True: {"one ms/token": [], "64 tok/s": []}, False: {"one ms/token": [], "64 tok/s": []}}
    for rnd in range(4):
        for ov in ((True, False) if rnd % 2 == 0 else (False, True)):
            eng._overlap = ov
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = llm.generate(prompt_token_ids=one, sampling_params=g)
            timing[ov]["one ms/token"].append(round((time.perf_counter() - t) / 256 * 1e3, 3))
            t = time.perf_counter()
            outs = llm.generate(prompt_token_ids=batch, sampling_params=SamplingParams(max_tokens=128, temperature=0.0,
                                                                                       ignore_eos=True))
            timing[ov]["64 tok/s"].append(round(sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t)))
            res["0.6b timing (overlap on=True)"] = timing
            save()
except Exception:
    res["0.6b error"] = traceback.format_exc()[-2500:]
res["total s"] = round(time.monotonic() - t0, 1)
save()

"""Kernel choice by measurement (kernels/cpu/select.py), driven with fake timings: the pure choice, tie-breaks,
layouts shared between row buckets, failing and unsupported candidates, and the disk cache (hit, miss,
invalidated key)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from hetero_infer.kernels.cpu import linear as cpu_linear
from hetero_infer.kernels.cpu import select

PREF = ("own", "onednn", "torch")


def test_choose_fastest_and_tie_break_by_preference():
    assert select.choose({"own": 3.0, "onednn": 2.0, "torch": 5.0}, PREF) == "onednn"
    # within 3% of the fastest, the earlier candidate wins; beyond, the faster one
    assert select.choose({"own": 2.05, "onednn": 2.0, "torch": 5.0}, PREF) == "own"
    assert select.choose({"own": 2.07, "onednn": 2.0, "torch": 5.0}, PREF) == "onednn"
    assert select.choose({"own": 1.0, "onednn": 1.0, "torch": 1.0}, PREF) == "own"
    assert select.choose({"own": 1.0, "onednn": 1.0, "torch": 1.0}, ("torch", "onednn", "own")) == "torch"


def test_choose_skips_failed_and_unsupported_candidates():
    assert select.choose({"own": None, "onednn": 2.0, "torch": 1.9}, PREF) == "torch"
    assert select.choose({"own": math.nan, "onednn": math.inf, "torch": 9.0}, PREF) == "torch"
    assert select.choose({"onednn": 2.0}, PREF) == "onednn"  # "own" missing: not built for this ISA
    assert select.choose({"own": 0.0, "onednn": 2.0}, PREF) == "onednn"  # a zero time is no measurement
    assert select.choose({"own": None, "onednn": None}, PREF) is None
    assert select.choose({}, PREF) is None


def test_bucket_index():
    assert [select.bucket_index(m) for m in (1, 2, 8, 9, 32, 33, 256, 5000)] == [0, 1, 1, 2, 2, 3, 3, 3]


def test_plan_reuses_a_layout_within_the_layout_tie():
    per_bucket = [
        {"own": 1.0, "onednn": 1.5, "torch": 3.0},
        {"own": 2.0, "onednn": 2.5, "torch": 3.0},
        {"own": 4.2, "onednn": 4.0, "torch": 9.0},  # onednn 5% faster: not worth a second copy of the weight
        {"own": 9.0, "onednn": 6.0, "torch": 8.0},  # onednn 33% faster: a second layout
    ]
    assert select.plan_buckets(per_bucket, PREF) == ("own", "own", "own", "onednn")
    assert select.plan_buckets(per_bucket, PREF, layout_tie=0.0) == ("own", "own", "onednn", "onednn")
    per_bucket[1]["own"] = None  # failed at 8 rows: another candidate serves that bucket
    assert select.plan_buckets(per_bucket, PREF) == ("own", "onednn", "onednn", "onednn")
    with pytest.raises(ValueError):
        select.plan_buckets([{"own": 1.0}, {"own": None, "torch": None}], PREF)


def _fake_candidates(times: dict[str, list[float]], log: list[str]):
    """Candidates whose calls return their fake duration (the next of `times[name]`, the last repeating)."""
    def make(name):
        def at_rows(rows):
            seq = iter(times[name])
            last = [None]

            def call():
                log.append(name)
                last[0] = next(seq, last[0])
                return last[0] * rows
            return call
        return at_rows
    return {name: make(name) for name in times}


def test_measure_takes_the_minimum_and_stops_once_settled():
    log: list[str] = []
    # first value is the warm-up call; a disturbance (9.0) only adds time
    cands = _fake_candidates({"own": [100.0, 9.0, 1.0, 1.02, 1.01, 1.0], "onednn": [100.0, 2.0, 2.0, 2.0]}, log)
    out = select.measure(cands, buckets=(1, 8), timer=lambda fn: fn(), rounds=select.Rounds(budget_s=1e9))
    assert out[0] == {"own": 1.0, "onednn": 2.0}
    assert out[1] == {"own": 8.0, "onednn": 16.0}
    # interleaved: warm-ups, then own/onednn alternating; both settled (two best within 5%) after 4 rounds
    assert log[:8] == ["own", "onednn", "own", "onednn", "own", "onednn", "own", "onednn"]
    assert log.count("own") == 2 * (1 + 4)


def test_measure_drops_losers_and_records_failures():
    log: list[str] = []
    cands = _fake_candidates({"own": [1.0, 1.0], "slow": [5.0, 5.0]}, log)

    def unsupported(rows):
        raise cpu_linear.Unsupported("not on this ISA")

    def breaks_later(rows):
        def call():
            if log.count("late") >= 1:
                raise RuntimeError("kernel failed")
            log.append("late")
            return 0.5
        return call

    cands.update(missing=unsupported, late=breaks_later)
    out = select.measure(cands, buckets=(1,), timer=lambda fn: fn(), rounds=select.Rounds(budget_s=1e9))
    assert out == [{"own": 1.0, "slow": 5.0, "missing": None, "late": None}]
    assert log.count("slow") == 1 + 4  # 5x the leader: dropped after four rounds
    assert select.plan_buckets(out, ("missing", "late", "slow", "own")) == ("own",)


def test_measure_respects_the_budget():
    log: list[str] = []
    cands = _fake_candidates({"a": [1.0, 1.0, 2.0, 3.0, 4.0]}, log)  # never settles after the first
    select.measure(cands, buckets=(1,), timer=lambda fn: fn(), rounds=select.Rounds(min_rounds=1, budget_s=2.5))
    assert log.count("a") == 1 + 2  # warm-up, then 1.0 and 2.0 spent 3.0 > 2.5
    log.clear()
    cands = _fake_candidates({"a": [1.0, 3.0, 5.0, 9.0]}, log)
    select.measure(cands, buckets=(1,), timer=lambda fn: fn(), rounds=select.Rounds(max_rounds=4, budget_s=1e9))
    assert log.count("a") == 1 + 4


KEY = select.MachineKey("AMD EPYC", "abc", 2, "2.13.0+cpu", "0.1.0", "deadbeef")


def test_cache_miss_hit_and_invalidated_key(tmp_path):
    cache = select.ChoiceCache(tmp_path, KEY)
    assert cache.get("linear:bfloat16:960x576") is None  # miss
    timings = [{"own": 1.0, "onednn": None}]
    cache.put("linear:bfloat16:960x576", ("own",) * 4, timings)
    again = select.ChoiceCache(tmp_path, KEY)  # a second start, same machine: hit
    assert again.get("linear:bfloat16:960x576") == ("own",) * 4
    for field, value in [("cpu_model", "Intel Xeon Platinum 8480+"), ("cpu_flags", "abd"), ("threads", 1),
                         ("torch", "2.14.0"), ("project", "0.2.0"), ("kernels", "feedbeef")]:
        changed = dataclasses.replace(KEY, **{field: value})
        assert changed.digest() != KEY.digest()
        assert select.ChoiceCache(tmp_path, changed).get("linear:bfloat16:960x576") is None, field


def test_cache_merges_writers_and_survives_bad_files(tmp_path):
    a, b = select.ChoiceCache(tmp_path, KEY), select.ChoiceCache(tmp_path, KEY)
    a.put("x", ("own",), [{}])
    b.put("y", ("torch",), [{}])  # b read the file before a wrote: the write merges, nothing is lost
    fresh = select.ChoiceCache(tmp_path, KEY)
    assert fresh.get("x") == ("own",) and fresh.get("y") == ("torch",)
    data = json.loads(fresh.path.read_text())
    data["key"]["torch"] = "other"  # a file whose recorded key is not ours counts as a miss
    fresh.path.write_text(json.dumps(data))
    assert select.ChoiceCache(tmp_path, KEY).get("x") is None
    fresh.path.write_text("{not json")
    assert select.ChoiceCache(tmp_path, KEY).get("x") is None


def test_selector_second_start_measures_nothing(tmp_path, monkeypatch):
    weight = torch.randn(40, 24)
    first = cpu_linear.LinearSelector(select.ChoiceCache(tmp_path, KEY))
    plan = first.plan(weight)
    assert first.measured == 1 and len(plan) == len(select.BUCKETS)
    assert set(plan) <= set(cpu_linear.CANDIDATES[torch.float32])
    assert first.plan(weight.clone()) == plan and first.measured == 1  # same shape: measured once

    def no_timing(*args, **kwargs):
        raise AssertionError("a cached choice must not be measured again")

    monkeypatch.setattr(select, "measure", no_timing)
    second = cpu_linear.LinearSelector(select.ChoiceCache(tmp_path, KEY))
    assert second.plan(weight) == plan and second.measured == 0


def test_selector_remeasures_a_cached_kernel_that_does_not_run_here(tmp_path, monkeypatch):
    """A cache written where the bfloat16 GEMM ran, read where it does not (no AVX512_BF16 in this build)."""
    weight = torch.randn(64, 32).to(torch.bfloat16)
    cache = select.ChoiceCache(tmp_path, KEY)
    cache.put("linear:bfloat16:64x32", ("gemm_bf16",) * len(select.BUCKETS), [{}])
    monkeypatch.setattr(cpu_linear, "_gemm_bf16", lambda: None)
    selector = cpu_linear.LinearSelector(select.ChoiceCache(tmp_path, KEY))
    plan = selector.plan(weight)
    assert selector.measured == 1 and "gemm_bf16" not in plan
    with pytest.raises(cpu_linear.Unsupported):
        cpu_linear.pack_as("gemm_bf16", weight)

"""HETERO_INFER_CPU_ISA (kernels/cpu/native.py): the ISA level the C kernels are built at, refused with a clear
error where it is unknown or the CPU lacks it; the build's log line with its time; why the fused decode step is
off where the build has none, and what that costs."""

from __future__ import annotations

import logging

import pytest
import torch

from hetero_infer.kernels.cpu import decode_step, native


def test_unknown_level_is_refused(monkeypatch):
    monkeypatch.setenv("HETERO_INFER_CPU_ISA", "sse9")
    monkeypatch.delenv("HETERO_INFER_CPU_MARCH", raising=False)
    with pytest.raises(ValueError, match="HETERO_INFER_CPU_ISA='sse9': expected one of native, avx512, avx2, portable"):
        native.isa_request()


@pytest.mark.parametrize("level,flags", [("avx2", {"avx2"}), ("avx512", {"avx2", "fma"})])
def test_a_level_the_cpu_lacks_is_refused(monkeypatch, level, flags):
    """A library with instructions the CPU lacks would die of SIGILL at its first call."""
    monkeypatch.setenv("HETERO_INFER_CPU_ISA", level)
    monkeypatch.setattr(native, "cpu_flags", lambda: flags)
    monkeypatch.setattr(native.platform, "machine", lambda: "x86_64")
    with pytest.raises(ValueError, match="this CPU lacks"):
        native.isa_request()


@pytest.mark.parametrize("level,march", [("avx2", "x86-64-v3"), ("portable", "x86-64-v2"), ("native", "native"),
                                         ("", "native")])
def test_levels_map_to_their_targets(monkeypatch, level, march):
    monkeypatch.setenv("HETERO_INFER_CPU_ISA", level)
    monkeypatch.delenv("HETERO_INFER_CPU_MARCH", raising=False)
    monkeypatch.setattr(native, "cpu_flags", lambda: {"avx2", "fma"})
    assert native._march() == f"-march={march}"
    monkeypatch.setenv("HETERO_INFER_CPU_MARCH", "skylake-avx512")  # a named target wins
    assert native._march() == "-march=skylake-avx512"


def test_the_build_logs_its_time_and_level(monkeypatch, caplog):
    assert native.library() is not None
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_tried", False)
    with caplog.at_level(logging.INFO, logger=native.__name__):
        assert native.library() is not None
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("CPU kernels:")]
    assert len(lines) == 1 and f"ISA level {native.isa()}" in lines[0], lines
    assert " in " in lines[0] and lines[0].split(" in ")[1].split(" s ")[0].replace(".", "").isdigit(), lines


def test_fused_step_off_says_why_and_what_it_costs(monkeypatch):
    monkeypatch.setattr(decode_step, "available", lambda dtype=torch.bfloat16: False)
    reason, covered = decode_step._unsupported(None, type("B", (), {"name": "cpu"})(), torch.float32)
    assert covered == ()
    assert f"ISA level {native.isa()}" in reason and "AVX2 + FMA" in reason  # why
    assert "per op" in reason and "fork/joins" in reason  # what the user loses

"""A measured kernel choice is cached per machine key (kernels/cpu/select.py); a change to the bfloat16 GEMM's
source (kernels/cpu/csrc/gemm.c) must make another key, so a faster or slower kernel is measured again."""

from __future__ import annotations

import shutil

from hetero_infer.kernels.cpu import native, select


def test_a_change_to_gemm_c_is_another_cache_key(tmp_path, monkeypatch):
    src = tmp_path / "csrc"
    shutil.copytree(native.SOURCES, src)
    monkeypatch.setattr(native, "SOURCES", src)
    before = select.MachineKey.here(1)
    assert before.kernels == (native.build_digest() if native.library() is not None else "none")
    gemm = src / "gemm.c"
    gemm.write_text(gemm.read_text() + "\n/* the kernel changed */\n")
    after = select.MachineKey.here(1)
    if native.library() is not None:
        assert after.kernels != before.kernels and after.digest() != before.digest()
        cache = tmp_path / "choices"
        assert select.ChoiceCache(cache, before).path != select.ChoiceCache(cache, after).path
    else:  # no C library here: nothing of it is cached, the key says so
        assert after.kernels == before.kernels == "none"

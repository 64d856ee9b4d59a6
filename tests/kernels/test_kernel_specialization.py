"""The kernels' compile keys leave out what changes from step to step: Triton compiles a kernel once per
specialisation of its integer arguments (equal to 1, divisible by 16, neither), so a per-step size in the key
means compiles in the middle of serving (the H100 run of 2026-11-27 lost ~10 s of a 15 s benchmark to them).
Checked on Triton's real JIT objects (not the interpreter's), in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# kernel -> the arguments that vary per step (batch, tokens, table width, splits)
PER_STEP = {
    "_triton_attention._prefill_kernel": {"num_seqs", "search_iters", "s_btb"},
    "_triton_attention._decode_kernel": {"num_splits", "s_btb"},
    "_triton_attention._decode_reduce_kernel": {"num_splits"},
    "_triton_ops._rms_norm_kernel": {"n_rows"},
    "_triton_quant._w8_kernel": {"M", "s_os"},
    "_triton_quant._w4_kernel": {"M", "s_os"},
    "_triton_quant._splitk_reduce_kernel": {"M"},
}

_PROBE = """
import importlib, json
from triton.runtime.jit import JITFunction
from hetero_infer.kernels import _backend
out = {"kernels": {}}
for m in _backend.TRITON_MODULES:
    mod = importlib.import_module("hetero_infer.kernels." + m)
    for name, obj in vars(mod).items():
        if isinstance(obj, JITFunction):
            dns = [obj.arg_names[a] if isinstance(a, int) else a for a in obj.do_not_specialize]
            out["kernels"][m + "." + name] = {"args": obj.arg_names, "dns": dns}
k = importlib.import_module("hetero_infer.kernels._triton_ops")._rms_norm_kernel
out["before"] = _backend.triton_compiles()
k.device_caches["probe"] = ({"key-a": None, "key-b": None}, {}, None, None, None)  # as Triton 3.x stores them
out["after"] = _backend.triton_compiles()
del k.device_caches["probe"]
print(json.dumps(out))
"""


def _probe() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_per_step_sizes_are_not_specialised_and_compiles_are_counted() -> None:
    probe = _probe()
    kernels = probe["kernels"]
    for name, info in kernels.items():
        assert set(info["dns"]) <= set(info["args"]), (name, "names an argument it does not have")
    for name, varying in PER_STEP.items():
        assert name in kernels, name
        assert varying <= set(kernels[name]["dns"]), (name, varying - set(kernels[name]["dns"]))
    assert probe["before"] == {} and probe["after"] == {"_rms_norm_kernel": 2}

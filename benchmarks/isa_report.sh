#!/usr/bin/env bash
# Issue 42's table on this machine, in one command (run it on an AVX2-only CPU: Zen 2/3, Haswell-Skylake client):
#
#   bash benchmarks/isa_report.sh OUT [--emulate-avx2]
#
# 1. the default workload, float32 and bfloat16, beside transformers `generate` (ours ÷ transformers);
# 2. one request in both dtypes (tok/s; decode weight bytes/s ÷ the copy bandwidth);
# 3. a busy process beside each system's run (`--contention steady`), both dtypes;
# 4. the INT8 / INT4 weight-only linears at this CPU's level against the portable path (and AVX-512 where the CPU
#    has it).
# Each step's table and JSON land in OUT (with `lscpu`'s model and the load average before and after), to paste
# into docs/benchmarks.md. --emulate-avx2 builds the AVX2 library on an AVX-512 CPU and holds PyTorch, oneDNN and
# MKL to AVX2 (caches and datapaths stay that CPU's: indicative, not an AVX2-only machine's numbers).
# Takes 30-60 minutes on 2 vCPUs (transformers' bfloat16 without AVX512_BF16 is the slow part).
set -euo pipefail
out=${1:?usage: bash benchmarks/isa_report.sh OUT [--emulate-avx2]}
mkdir -p "$out"
cd "$(dirname "$0")/.."
levels=avx2,portable
if [[ ${2:-} == --emulate-avx2 ]]; then
    export HETERO_INFER_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
    levels=avx512,avx2,portable
elif grep -q avx512f /proc/cpuinfo; then
    levels=avx512,avx2,portable
fi
{
    lscpu | grep -E "Model name|^CPU\(s\)"
    echo "AVX flags: $(grep -o -w 'avx[a-z0-9_]*\|fma' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    echo "load before: $(uptime)"
} > "$out/machine.txt"
bench=(python -m hetero_infer.cli bench --no-scheduler-overhead --dtypes "float32,bfloat16")
"${bench[@]}" --peers hf-generate --json "$out/default.json" | tee "$out/default.txt"
"${bench[@]}" --num-requests 1 --peers none --json "$out/one.json" | tee "$out/one.txt"
"${bench[@]}" --peers hf-generate --contention steady --json "$out/steady.json" | tee "$out/steady.txt"
python benchmarks/cpu_quant_linear_bench.py --isa-levels "$levels" --rounds 2 --threads 1 --rows 1 8 32 \
    | tee "$out/quant.txt"
echo "load after: $(uptime)" >> "$out/machine.txt"
cat "$out/machine.txt"

#!/usr/bin/env bash
# The project's GPU check on a bare GPU machine (torch, Triton, transformers; no network):
#   bash benchmarks/gpu_check.sh OUT [--phases suite,tune,bench,profile,peers,moe,kv_tier,serving,tp] [--budget-s S] [--kernel-configs F]
#                                    [--workloads qwen3-nano,qwen3-one,llama8b-one,llama8b-64,qwen3moe-one,qwen3moe-nano]
# (--phases lora: issue 39 LoRA mix on the Qwen3-0.6B and Llama-3-8B shapes, LoRA CUDA graphs on and off)
# needs .gpucheck/ beside the checkout (`python benchmarks/gpu_check.py prepare` on a machine with network).
# Prints one table at the end and writes OUT/gpu_check.json plus one log per phase (docs/benchmarks.md).
set -u
cd "$(dirname "$0")/.." || exit 1
out=${1:?usage: gpu_check.sh OUT [options]}
shift
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HETERO_INFER_CACHE=/tmp/gpucheck/cache
mkdir -p "$out" /tmp/gpucheck
if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpucheck/whl/*.whl > "$out/install.log" 2>&1; then
  cat "$out/install.log"; exit 1
fi
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
exec python3 benchmarks/gpu_check.py check "$out" "$@"

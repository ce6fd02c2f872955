#!/usr/bin/env bash
# Structured outputs on one GPU: TPOT of 64 requests under one JSON schema vs the same batch unconstrained
# (Qwen3-0.6B shape, dummy weights, bf16), with default flags and with the fastest decode flags of the README
# (--use-skinny-gemm, TRITON_ATTN); then the GPU test. Needs xgrammar: pip install 'attnserve[structured]'.
# Usage, from the checkout's root: bash benchmarks/gpu/structured_tpot.sh OUT_DIR
set -u
out=${1:-/tmp}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -c "import xgrammar" 2>/dev/null || pip install -q 'xgrammar>=0.1.25' jsonschema
bench() { python3 -m benchmarks.gpu.bench_structured_tpot "$@" 2>&1 | grep -v -E "^(INFO|WARNING)"; }
echo "== batch 64, default flags"
bench --json "$out/structured-default.json"
echo "== batch 64, use_skinny_gemm, TRITON_ATTN"
bench --json "$out/structured-skinny.json" use_skinny_gemm=true attention_backend=TRITON_ATTN
echo "== GPU test"
python3 -m pytest tests/gpu/test_structured_outputs_gpu.py -q -p no:cacheprovider 2>&1 | tail -5

#!/usr/bin/env bash
# fp8 KV cache on one GPU (issue 26): each part fits one 10-minute device call.
#   attention: bench attention, decode batch 64 x 8k context, GQA 32/8, head 128, every fp8-capable backend,
#              bf16 cache vs fp8 (e4m3; e5m2 where the backend takes it); prints each backend's fp8 speedup
#   latency:   bench latency, Llama-3.1-8B shape (dummy weights), batch 64, 4k prompt + 128 tokens, bf16 vs fp8 cache
#   agreement: the default model, fp8 vs bf16 cache: greedy-token agreement and mean KL (teacher-forced,
#              attnserve.benchmarks.kv_cache_agreement), per backend
# Usage, from the checkout's root: bash benchmarks/gpu/fp8_kv.sh OUT_DIR [attention|latency|agreement|all]
set -u
out=${1:-/tmp}
part=${2:-all}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
quiet() { grep -v -E "^(INFO|WARNING):|Writing|it/s"; }
FP8_BACKENDS=${FP8_BACKENDS:-"FLASH_ATTN FLASHINFER TRITON_ATTN"}  # the environment may name fewer
# the shapes carry no tokenizer: the staged one (stage.sh tok), else the default model's (installed)
tok=(); [[ -n ${ATTNSERVE_TEST_TOKENIZER:-} ]] && tok=(--tokenizer "$ATTNSERVE_TEST_TOKENIZER")

if [[ $part == attention || $part == all ]]; then
  for kv in auto fp8 fp8_e5m2; do
    echo "== bench attention, kv_cache_dtype $kv"
    python3 -m attnserve bench attention --dtype bfloat16 --kv-cache-dtype "$kv" --backends $FP8_BACKENDS \
      --num-heads 32 --num-kv-heads 8 --head-size 128 --block-size 16 --batch-size 64 --context-lens 8192 \
      --prefill-lens 8192 --warmup 5 --repeats 20 --no-progress --output-json "$out/attention-$kv.json" 2>&1 | quiet
  done
  python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
runs = {kv: json.load(open(f"{out}/attention-{kv}.json")) for kv in ("auto", "fp8", "fp8_e5m2")}
def rows(kv, phase):
    return {r["backend"]: r for r in runs[kv]["results"] if r["phase"] == phase and r["status"] == "ok"}
for phase in ("decode", "prefill"):
    base = rows("auto", phase)
    for kv in ("fp8", "fp8_e5m2"):
        for name, r in rows(kv, phase).items():
            b = base.get(name)
            if b:
                kvb = f" KV {r['kv_TBps']:.2f} vs {b['kv_TBps']:.2f} TB/s" if phase == "decode" else ""
                print(f"{phase:<8} {name:<12} {kv:<9} {r['time_us']:9.1f} us vs bf16 {b['time_us']:9.1f} us: "
                      f"{b['time_us'] / r['time_us']:.2f}x{kvb}")
PY
fi

if [[ $part == latency || $part == all ]]; then
  for backend in $FP8_BACKENDS; do
    for kv in auto fp8; do
      echo "== bench latency, Llama-3.1-8B shape, batch 64, 4k context, $backend, kv_cache_dtype $kv"
      python3 -m attnserve bench latency --model benchmarks/shapes/llama-3.1-8b --load-format dummy --dtype bfloat16 \
        "${tok[@]}" --attention-backend "$backend" --kv-cache-dtype "$kv" --batch-size 64 --input-len 4096 --output-len 128 \
        --max-model-len 4352 --num-iters 2 --num-iters-warmup 1 --no-progress \
        --output-json "$out/latency-$backend-$kv.json" 2>&1 | quiet
    done
  done
fi

if [[ $part == agreement || $part == all ]]; then
  for backend in $FP8_BACKENDS; do
    echo "== default model, fp8 vs bf16 KV cache, $backend"
    python3 -m attnserve.benchmarks.kv_cache_agreement --attention-backend "$backend" --kv-cache-dtype fp8 \
      --num-tokens 64 --output-json "$out/agreement-$backend.json" 2>&1 | quiet
  done
fi

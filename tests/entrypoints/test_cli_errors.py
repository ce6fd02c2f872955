"""Every subcommand's bad-input paths: the exit status and the one line on stderr, exactly.

A usage error (a bad flag value, a bad combination of flags, a bad config file, an explicit attention
backend that cannot run the model here) exits 2 with one line ``PROG: error: MESSAGE`` (argparse's form;
PROG is ``attnserve``, ``attnserve generate``, ``attnserve bench serve``, ...); a valid request that cannot be
carried out (no server to benchmark) exits 1 with a line of the same form. ``backends --json`` prints the
same line; its stdout is then the report (JSON) or nothing.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from attnserve.benchmarks.requests import PROMPT_LINE
from attnserve.entrypoints.cli.main import main
from attnserve.platforms import detect_platform

AC_FIELDS = (
    "backend, flash_attn_version, use_prefill_decode_attention, flash_attn_max_num_splits_for_cuda_graph, "
    "use_trtllm_attention, disable_flashinfer_prefill, disable_flashinfer_q_quantization"
)
BACKENDS = "FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLEX_ATTENTION, CPU_ATTN, CUSTOM, auto"
# the default model's tiny cousin (head size 16) on CPU: TRITON_ATTN, chosen explicitly, cannot run it
# (where Triton is not installed, as in a fresh venv with the CPU build of torch, the line says so too)
# (after a flag that names the setting, the line does not name it again: TRITON_REFUSED)
TRITON_REFUSED = (
    "TRITON_ATTN cannot run this model (head_size 16, dtype float32, kv_cache_dtype "
    "auto, block_size 16) on {cpu}: device cpu not supported (supported: cuda); "
    + ("" if importlib.util.find_spec("triton") else "not installed: pip install 'attnserve[triton]'; ")
    + "head_size 16 not supported (>= 32). Backends that would work: CPU_ATTN, FLEX_ATTENTION."
)
TRITON_ON_CPU = "attention backend " + TRITON_REFUSED
# automatic selection with an fp8 KV cache and separate prefill/decode calls on CPU: one line, each backend's
# reasons, the KV-cache flag named (CPU_ATTN refuses the option, FLEX_ATTENTION the cache)
NO_BACKEND_FP8 = (
    "no attention backend can run this model (head_size 16, dtype float32, kv_cache_dtype fp8, "
    "block_size 16) on {cpu}: CPU_ATTN: use_prefill_decode_attention not supported: CPU_ATTN always "
    "runs decodes and prefills in separate calls. FLEX_ATTENTION: kv_cache_dtype fp8 not supported "
    "(supported: auto)."
)
PD = ["-ac.use_prefill_decode_attention", "true"]
# the tiny model's 4 query heads over 2 KV heads on 3 ranks
SPLIT_3 = (
    "3 cannot split 4 query heads over 2 KV heads: with fewer KV heads than ranks the ranks "
    "must be a multiple of the KV heads and divide each KV head's 2 query heads (allowed for this model: "
    "tensor_parallel_size 1, 2, 4)"
)
SPLIT = "tensor_parallel_size " + SPLIT_3
HUMAN_INT = (
    "suffixes as in vLLM: k, m, g, t = 10^3, 10^6, 10^9, 10^12 (with a fraction: 1.5k); "
    "K, M, G, T = 2^10, 2^20, 2^30, 2^40 (whole numbers only)"
)
NOT_FOUND = (
    "model '/no/such/dir' not found: give a folder with config.json and safetensors, a .gguf file, or a "
    "Hugging Face Hub id (org/name)"
)

CASES = [
    # attnserve
    (["nosuch"], 2, "attnserve: error: argument COMMAND: invalid choice: 'nosuch' (choose from "),
    # generate: its own flags, engine flags, attention flags, config files
    (
        ["generate", "--max-tokens", "x"],
        2,
        "attnserve generate: error: argument --max-tokens: 'x' is not an integer (allowed: integer >= 1)",
    ),
    (
        ["generate", "--max-tokens", "0"],
        2,
        "attnserve generate: error: argument --max-tokens: 0 not allowed (allowed: integer >= 1)",
    ),
    (
        ["generate", "--top-k", "-2"],
        2,
        "attnserve generate: error: argument --top-k: -2 not allowed (allowed: 0 or -1 (all), or integer >= 1)",
    ),
    (
        ["generate", "--prompt", ""],
        2,
        "attnserve generate: error: argument --prompt: '' not allowed (allowed: a prompt "
        "of at least 1 token); leave --prompt out for the default prompt",
    ),
    (
        ["generate", "--prompts-file", "{tmp}/none.txt"],
        2,
        "attnserve generate: error: argument --prompts-file: {tmp}/none.txt: No such file or directory",
    ),
    (
        ["generate", "--prompts-file", "{tmp}/empty.txt"],
        2,  # was: the default prompt, silently
        "attnserve generate: error: argument --prompts-file: {tmp}/empty.txt has no prompts (give one prompt per line, "
        "or leave --prompts-file out for the default prompt)",
    ),
    (
        ["generate", "--prompt", "hi", "--prompts-file", "{tmp}/blank.txt"],
        2,
        "attnserve generate: error: argument --prompts-file: {tmp}/blank.txt has no prompts (give one prompt per line, "
        "or leave --prompts-file out for the default prompt)",
    ),
    (
        ["generate", "--prompts-file", "{tmp}/latin1.txt"],
        2,  # was "'utf-8' codec can't decode byte 0xe9 in position 10: ..."
        "attnserve generate: error: argument --prompts-file: {tmp}/latin1.txt is not UTF-8 text (byte 0xe9 at offset 10)",
    ),
    (["generate", "--model", "/no/such/dir"], 2, f"attnserve generate: error: {NOT_FOUND}"),
    (
        ["generate", "--block-size", "0"],
        2,
        "attnserve generate: error: argument --block-size: 0 not allowed (allowed: 1, 2, 4, 8, 16, 32, 64, 128, 256)",
    ),
    (
        ["generate", "--block-size", "7"],
        2,  # was accepted
        "attnserve generate: error: argument --block-size: 7 not allowed (allowed: 1, 2, 4, 8, 16, 32, 64, 128, 256)",
    ),
    (
        ["generate", "--attention-backend", "NOPE"],
        2,
        f"attnserve generate: error: argument --attention-backend: 'NOPE' not allowed (allowed: {BACKENDS})",
    ),
    (
        ["generate", "-ac", "{bad"],
        2,
        "attnserve generate: error: argument -ac: malformed JSON (line 1, column 2): "
        "Expecting property name enclosed in double quotes",
    ),
    (
        ["generate", "-ac", '{"no_such": 1}'],
        2,
        f"attnserve generate: error: argument -ac: unknown attention_config field 'no_such' in -ac (allowed: {AC_FIELDS})",
    ),
    (
        ["generate", "-ac.flash_attn_version", "5"],
        2,
        "attnserve generate: error: argument -ac.flash_attn_version: 5 not allowed (allowed: 2, 3, 4, null)",
    ),
    (
        ["generate", "-ac.no_such", "1"],
        2,
        f"attnserve generate: error: argument -ac.no_such: unknown attention_config field 'no_such' in -ac.no_such "
        f"(allowed: {AC_FIELDS})",
    ),
    (
        ["generate", "--config", "{tmp}/none.yaml"],
        2,
        "attnserve generate: error: cannot read config file '{tmp}/none.yaml': No such file or directory",
    ),
    (
        ["generate", "--config", "{tmp}/bad.yaml"],
        2,
        "attnserve generate: error: {tmp}/bad.yaml:2:1: malformed YAML: expected ',' or ']', but got '<stream end>'",
    ),
    (
        ["generate", "--model", "{tiny}", "--device", "cpu", "--attention-backend", "TRITON_ATTN"],
        2,
        f"attnserve generate: error: argument --attention-backend: {TRITON_REFUSED}",
    ),
    (
        ["generate", "--model", "{tiny}", "--device", "cpu", "--config", "{tmp}/triton.yaml"],
        2,
        f"attnserve generate: error: {{tmp}}/triton.yaml: {TRITON_ON_CPU}",
    ),
    # flags that do not go together: the line names them, the one given second first (argparse's form)
    (
        ["generate", "--attention-backend", "CPU_ATTN", "-ac.backend", "FLEX_ATTENTION"],
        2,
        "attnserve generate: error: argument -ac.backend: 'FLEX_ATTENTION' conflicts with --attention-backend "
        "'CPU_ATTN': they name different backends; set the attention backend in one place",
    ),  # was no 'argument'
    (
        [
            "generate",
            "--model",
            "{tiny}",
            "--device",
            "cpu",
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens",
            "4",
            "--prompt",
            "one two three four five six seven",
        ],
        2,  # was naming no flag
        "attnserve generate: error: argument --max-num-batched-tokens: prompt of 7 tokens exceeds max_num_batched_tokens "
        "4, and enable_chunked_prefill is false: a prompt must fit one step",
    ),
    (
        ["generate", "--model", "{tiny}", "--device", "cpu", "--max-model-len", "100000"],
        2,  # was naming no flag
        "attnserve generate: error: argument --max-model-len: 100000 not allowed (allowed: at most the "
        "model's max_position_embeddings, 512)",
    ),
    (
        ["generate", "--model", "{tiny}", "--device", "cpu", "--kv-cache-memory", "10"],
        2,  # was naming no flag
        "attnserve generate: error: argument --kv-cache-memory: KV-cache budget of 10 bytes holds no block of 8192 bytes; "
        "raise --kv-cache-memory or set --num-gpu-blocks",
    ),  # was 'raise kv_cache_memory or set num_gpu_blocks'
    (
        ["generate", "--model", "{tiny}", "--device", "cpu", "--kv-cache-memory-bytes", "10"],
        2,  # vLLM's name: as given
        "attnserve generate: error: argument --kv-cache-memory-bytes: KV-cache budget of 10 bytes holds no block of 8192 "
        "bytes; raise --kv-cache-memory-bytes or set --num-gpu-blocks",
    ),  # the advice as given too
    (
        [
            "generate",
            "--model",
            "{tiny}",
            "--device",
            "cpu",
            "--num-gpu-blocks",
            "1",
            "--block-size",
            "4",
            "--prompt",
            "one two three four",
        ],
        2,  # was 'request 0#0 needs ...', the engine's request id and no flag
        "attnserve generate: error: argument --num-gpu-blocks: prompt of 4 tokens needs 2 KV blocks (5 tokens with the one "
        "it generates), the KV cache has 1 (4 tokens), so at most 3 prompt tokens fit; raise --num-gpu-blocks",
    ),
    (
        ["generate", "--model", "{tiny}", "--device", "cpu", *PD, "--kv-cache-dtype", "fp8"],
        2,  # was 3 lines, no flag
        f"attnserve generate: error: argument --kv-cache-dtype: {NO_BACKEND_FP8}",
    ),
    (
        ["generate", "--model", "{tiny}", "--device", "cpu", "--config", "{tmp}/fp8.yaml"],
        2,
        f"attnserve generate: error: {{tmp}}/fp8.yaml: {NO_BACKEND_FP8}",
    ),
    (
        ["generate", "--model", "{tiny}", "--device", "cpu", "--tensor-parallel-size", "3"],
        2,  # these were naming no flag
        f"attnserve generate: error: argument --tensor-parallel-size: {SPLIT_3}",
    ),
    (
        ["generate", "--model", "{tiny_gpt2}", "--device", "cpu", "--tensor-parallel-size", "2"],
        2,
        "attnserve generate: error: argument --tensor-parallel-size: 2 not supported for "
        "GPT2LMHeadModel (tensor parallelism is built for the Llama family: Llama, Mistral, Qwen2, Qwen3, Gemma 2/3, and the MoE models)",
    ),
    (
        ["generate", "--config", "{tmp}/empty.yaml"],
        2,  # was read as no settings, while an empty JSON file was an error
        "attnserve generate: error: {tmp}/empty.yaml: empty config file (allowed: a mapping of engine argument names to "
        "values, e.g. 'dtype: float32', or {} for no settings)",
    ),
    (
        ["generate", "--json-config", "{tmp}/empty.txt"],
        2,  # was "malformed JSON: Expecting value"
        "attnserve generate: error: {tmp}/empty.txt: empty config file (allowed: a mapping of engine argument names to "
        'values, e.g. {"dtype": "float32"}, or {} for no settings)',
    ),
    (
        ["generate", "--config", "{tmp}/list.yaml"],
        2,
        "attnserve generate: error: {tmp}/list.yaml: the top level is a list (allowed: a mapping of engine argument names "
        "to values, e.g. 'dtype: float32', or {} for no settings)",
    ),
    (
        ["generate", "--config", "{tmp}/dtype.yaml"],
        2,
        "attnserve generate: error: {tmp}/dtype.yaml: dtype 'float64' "
        "not allowed (allowed: auto, float32, float16, bfloat16, float, half)",
    ),
    # serve
    (
        ["serve", "--port", "70000"],
        2,
        "attnserve serve: error: argument --port: 70000 not allowed (allowed: integer in [0, 65535]; 0 picks a free port)",
    ),
    (["serve", "/no/such/dir"], 2, f"attnserve serve: error: {NOT_FOUND}"),
    (
        ["serve", "{tiny}", "--device", "cpu", "--attention-backend", "TRITON_ATTN", "--port", "0"],
        2,  # before listening
        f"attnserve serve: error: argument --attention-backend: {TRITON_REFUSED}",
    ),  # was exit 1, 'the model failed to load'
    (
        ["serve", "{tiny}", "--device", "cpu", "--tensor-parallel-size", "3", "--port", "0"],
        2,  # before listening
        f"attnserve serve: error: argument --tensor-parallel-size: {SPLIT_3}",
    ),
    # these four were exit 1, 'the model failed to load', once the server listened and the model loaded
    (
        ["serve", "{tiny}", "--device", "cpu", "--max-model-len", "100000", "--port", "0"],
        2,
        "attnserve serve: error: argument --max-model-len: 100000 not allowed (allowed: at most the "
        "model's max_position_embeddings, 512)",
    ),
    (
        ["serve", "{tiny}", "--device", "cpu", "--kv-cache-memory", "10", "--port", "0"],
        2,
        "attnserve serve: error: argument --kv-cache-memory: KV-cache budget of 10 bytes holds no block of 8192 bytes; "
        "raise --kv-cache-memory or set --num-gpu-blocks",
    ),
    (
        ["serve", "{tiny}", "--device", "cpu", "--config", "{tmp}/small_kv.yaml", "--port", "0"],
        2,
        "attnserve serve: error: {tmp}/small_kv.yaml: KV-cache budget of 10 bytes holds no block of 8192 bytes; "
        "raise kv_cache_memory or set num_gpu_blocks",
    ),
    # a KV cache shorter than max_model_len: refused before the server listens, as vLLM refuses it (was: served, and
    # every request cut short at 32 tokens with finish_reason length while /v1/models reported max_model_len 512)
    (
        ["serve", "{tiny}", "--device", "cpu", "--num-gpu-blocks", "2", "--port", "0"],
        2,
        "attnserve serve: error: argument --num-gpu-blocks: the KV cache holds 32 tokens (2 blocks of 16), fewer than "
        "max_model_len 512, so not one request of max_model_len tokens fits; lower --max-model-len to at most 32 or raise "
        "--num-gpu-blocks",
    ),
    (
        ["serve", "{tiny}", "--device", "cpu", "--kv-cache-memory-bytes", "8K", "--port", "0"],
        2,
        "attnserve serve: error: argument --kv-cache-memory-bytes: the KV cache holds 16 tokens (1 block of 16), fewer "
        "than max_model_len 512, so not one request of max_model_len tokens fits; lower --max-model-len to at most 16 or "
        "raise --kv-cache-memory-bytes",
    ),
    (
        ["serve", "{tiny}", "--device", "cpu", "--config", "{tmp}/two_blocks.yaml", "--port", "0"],
        2,
        "attnserve serve: error: {tmp}/two_blocks.yaml: the KV cache holds 32 tokens (2 blocks of 16), fewer than "
        "max_model_len 512, so not one request of max_model_len tokens fits; lower max_model_len to at most 32 or raise "
        "num_gpu_blocks",
    ),
    # config: the same check, the same line (was: exit 0, the config printed), when a flag or file gives the size;
    # this machine's memory is not judged (a config may be for another machine)
    (
        ["config", "{tiny}", "--device", "cpu", "--num-gpu-blocks", "2"],
        2,
        "attnserve config: error: argument --num-gpu-blocks: the KV cache holds 32 tokens (2 blocks of 16), fewer than "
        "max_model_len 512, so not one request of max_model_len tokens fits; lower --max-model-len to at most 32 or raise "
        "--num-gpu-blocks",
    ),
    (
        ["config", "{tiny}", "--device", "cpu", "--kv-cache-memory-bytes", "8K"],
        2,
        "attnserve config: error: argument --kv-cache-memory-bytes: the KV cache holds 16 tokens (1 block of 16), fewer "
        "than max_model_len 512, so not one request of max_model_len tokens fits; lower --max-model-len to at most 16 or "
        "raise --kv-cache-memory-bytes",
    ),
    (
        ["config", "{tiny}", "--device", "cpu", "--config", "{tmp}/two_blocks.yaml"],
        2,
        "attnserve config: error: {tmp}/two_blocks.yaml: the KV cache holds 32 tokens (2 blocks of 16), fewer than "
        "max_model_len 512, so not one request of max_model_len tokens fits; lower max_model_len to at most 32 or raise "
        "num_gpu_blocks",
    ),
    (
        ["config", "{tiny}", "--device", "cpu", "--kv-cache-memory", "10"],
        2,
        "attnserve config: error: argument --kv-cache-memory: KV-cache budget of 10 bytes holds no block of 8192 bytes; "
        "raise --kv-cache-memory or set --num-gpu-blocks",
    ),
    (
        ["serve", "{tiny}", "--device", "cpu", *PD, "--kv-cache-dtype", "fp8", "--port", "0"],
        2,
        f"attnserve serve: error: argument --kv-cache-dtype: {NO_BACKEND_FP8}",
    ),
    (
        ["serve", "a", "--model", "b"],
        2,
        "attnserve serve: error: argument --model: 'b' conflicts with MODEL 'a': the model is given twice; give it once",
    ),
    (
        ["serve", "--model", "b", "a"],
        2,
        "attnserve serve: error: argument MODEL: 'a' conflicts with --model 'b': the model is given twice; give it once",
    ),
    # config
    # vLLM's sizes: a suffix it does not take names the unit and the suffixes it does (was "'1GiB' is not an integer")
    (
        ["config", "--kv-cache-memory-bytes", "1GiB"],
        2,
        "attnserve config: error: argument --kv-cache-memory-bytes: '1GiB' is not an integer (allowed: integer >= 1 "
        f"(bytes), null; {HUMAN_INT})",
    ),
    (
        ["config", "--max-model-len", "1.5K"],
        2,  # vLLM too: no fraction of a binary unit
        f"attnserve config: error: argument --max-model-len: '1.5K' is not an integer (allowed: integer >= 1, null; {HUMAN_INT})",
    ),
    (
        ["config", "--config", "{tmp}/gib.yaml"],
        2,
        f"attnserve config: error: {{tmp}}/gib.yaml: max_model_len '8KiB' is not an integer (allowed: integer >= 1, null; "
        f"{HUMAN_INT})",
    ),  # the flag's words
    (
        ["config", "--num-gpu-blocks-override", "0"],
        2,  # vLLM's name: the flag as given
        "attnserve config: error: argument --num-gpu-blocks-override: 0 not allowed (allowed: integer >= 1, null)",
    ),
    # a max_model_len the model does not allow: the line generate prints (was exit 0: config read no model)
    (
        ["config", "--max-model-len", "999999"],
        2,  # the default model
        "attnserve config: error: argument --max-model-len: 999999 not allowed (allowed: at most the "
        "model's max_position_embeddings, 8192)",
    ),
    (
        ["config", "{tiny}", "--max-model-len", "1M"],
        2,
        "attnserve config: error: argument --max-model-len: 1048576 not allowed (allowed: at most the "
        "model's max_position_embeddings, 512)",
    ),
    (
        ["config", "--config", "{tmp}/bad.yaml"],
        2,
        "attnserve config: error: {tmp}/bad.yaml:2:1: malformed YAML: expected ',' or ']', but got '<stream end>'",
    ),
    # backends
    (
        ["backends", "--model", "/no/such/dir"],
        2,
        f"attnserve backends: error: argument --model: {NOT_FOUND} (or pass --head-size, --num-heads, --num-kv-heads)",
    ),
    (
        ["backends", "--head-size", "0"],
        2,
        "attnserve backends: error: argument --head-size: 0 not allowed (allowed: integer >= 1)",
    ),
    (
        ["backends", "--head-size", "64", "--num-heads", "0"],
        2,  # was taken as "not given"
        "attnserve backends: error: argument --num-heads: 0 not allowed (allowed: integer >= 1)",
    ),
    (
        ["backends", "--head-size", "64", "--num-kv-heads", "-1"],
        2,  # was reported as -1 KV heads
        "attnserve backends: error: argument --num-kv-heads: -1 not allowed (allowed: integer >= 1)",
    ),
    (
        ["backends", "--model", "/no/such/dir", "--json"],
        2,  # stdout: nothing
        f"attnserve backends: error: argument --model: {NOT_FOUND} (or pass --head-size, --num-heads, --num-kv-heads)",
    ),
    # an explicit backend that cannot run: exit 2 and the line generate prints; stdout: the table, or the JSON report
    (
        ["backends", "--model", "{tiny}", "--device", "cpu", "--attention-backend", "TRITON_ATTN"],
        2,
        f"attnserve backends: error: argument --attention-backend: {TRITON_REFUSED}",
    ),  # was exit 1
    (
        ["backends", "--model", "{tiny}", "--device", "cpu", "--attention-backend", "TRITON_ATTN", "--json"],
        2,
        f"attnserve backends: error: argument --attention-backend: {TRITON_REFUSED}",
    ),  # was exit 1 and no line
    (
        [
            "backends",
            "--device",
            "cuda:8.0",
            "--assume-installed",
            "--attention-backend",
            "FLASHINFER",
            "--head-size",
            "80",
        ],
        2,
        "attnserve backends: error: argument --attention-backend: FLASHINFER cannot run this model (head_size 80, dtype bfloat16, "
        "kv_cache_dtype auto, block_size 16) on simulated CUDA device (compute capability 8.0): head_size 80 not "
        "supported (supported: 64, 128, 256). Backends that would work: TRITON_ATTN, FLEX_ATTENTION.",
    ),
    # bench
    (["bench"], 2, "attnserve bench: error: the following arguments are required: KIND"),
    (
        ["bench", "throughput", "--model", "{tiny}", "--device", "cpu", "--prompts-file", "{tmp}/none.txt"],
        2,
        "attnserve bench throughput: error: argument --prompts-file: {tmp}/none.txt: No such file or directory",
    ),
    (
        ["bench", "throughput", "--model", "{tiny}", "--device", "cpu", "--prompts-file", "{tmp}/empty.txt"],
        2,
        "attnserve bench throughput: error: argument --prompts-file: {tmp}/empty.txt has no prompts (give one prompt per "
        "line, or leave --prompts-file out for random prompts)",
    ),  # was "no prompts in '...'", after the model loaded
    (
        ["bench", "throughput", "--model", "{tiny}", "--device", "cpu", "--prompts-file", "{tmp}/latin1.txt"],
        2,
        "attnserve bench throughput: error: argument --prompts-file: {tmp}/latin1.txt is not UTF-8 text (byte 0xe9 at "
        "offset 10)",
    ),  # was "'utf-8' codec can't decode byte 0xe9 in position 10: invalid continuation byte"
    (
        [
            "bench",
            "throughput",
            "--model",
            "{tiny}",
            "--device",
            "cpu",
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens",
            "4",
            "--input-len",
            "8",
            "--num-prompts",
            "1",
            "--output-len",
            "1",
            "--no-progress",
        ],
        2,
        "attnserve bench throughput: error: argument --max-num-batched-tokens: prompt of 8 tokens exceeds "
        "max_num_batched_tokens 4, and enable_chunked_prefill is false: a prompt must fit one step",
    ),
    (
        ["bench", "throughput", "--model", "/no/such/dir"],
        2,
        f"attnserve bench throughput: error: {NOT_FOUND}",
    ),  # was "None: None"
    (["bench", "latency", "--model", "/no/such/dir"], 2, f"attnserve bench latency: error: {NOT_FOUND}"),
    (
        ["bench", "latency", "--model", "{tiny}", "--device", "cpu", "--compare-tensor-parallel-sizes", "1", "3"],
        2,
        f"attnserve bench latency: error: argument --compare-tensor-parallel-sizes: {SPLIT}",
    ),  # not --tensor-parallel-size
    (
        ["bench", "throughput", "--model", "{tiny}", "--device", "cpu", *PD, "--kv-cache-dtype", "fp8"],
        2,
        f"attnserve bench throughput: error: argument --kv-cache-dtype: {NO_BACKEND_FP8}",
    ),
    (
        ["bench", "latency", "--model", "{tiny}", "--device", "cpu", "--tensor-parallel-size", "3"],
        2,
        f"attnserve bench latency: error: argument --tensor-parallel-size: {SPLIT_3}",
    ),
    (
        ["bench", "attention", "--backends", "NOPE"],
        2,
        "attnserve bench attention: error: argument --backends: unknown "
        "attention backend 'NOPE' (valid: FLASH_ATTN, FLASHINFER, TRITON_ATTN, "
        "FLEX_ATTENTION, CPU_ATTN, auto)",
    ),
    (
        ["bench", "attention", "--num-heads", "6", "--num-kv-heads", "4"],
        2,
        "attnserve bench attention: error: argument --num-heads: 6 is not a multiple of --num-kv-heads 4",
    ),
    (
        ["bench", "serve", "--dataset", "file"],
        2,
        "attnserve bench serve: error: argument --dataset: file needs --prompt-file",
    ),
    # these three were tracebacks from httpx once the run had started
    (
        ["bench", "serve", "--port", "70000"],
        2,
        "attnserve bench serve: error: argument --port: 70000 not allowed (allowed: integer in [1, 65535])",
    ),
    (
        ["bench", "serve", "--base-url", "http://127.0.0.1:99999"],
        2,
        "attnserve bench serve: error: argument --base-url: 'http://127.0.0.1:99999' not allowed (allowed: an http:// "
        "or https:// URL with a host, and a port in [1, 65535] if it names one)",
    ),
    (
        ["bench", "serve", "--host", "::::"],
        2,
        "attnserve bench serve: error: argument --host: '::::' not allowed (allowed: a host name or IP address)",
    ),
    (
        ["bench", "serve", "--model", "m", "--dataset", "file", "--prompt-file", "{tmp}/none.txt"],
        2,
        "attnserve bench serve: error: argument --prompt-file: {tmp}/none.txt: No such file or directory",
    ),
    (
        ["bench", "serve", "--model", "m", "--dataset", "file", "--prompt-file", "{tmp}/empty.txt"],
        2,
        "attnserve bench serve: error: argument --prompt-file: {tmp}/empty.txt has no prompts (give one prompt per line, "
        "or leave --prompt-file out for random prompts)",
    ),  # was "no prompts in '...'"
    (
        ["bench", "serve", "--model", "m", "--dataset", "file", "--prompt-file", "{tmp}/latin1.txt"],
        2,
        "attnserve bench serve: error: argument --prompt-file: {tmp}/latin1.txt is not UTF-8 text (byte 0xe9 at offset 10)",
    ),
    # a bad JSONL line: the file, the line and what a line must be, before any request (was a KeyError traceback)
    (
        ["bench", "serve", "--model", "m", "--dataset", "file", "--prompt-file", "{tmp}/nokey.jsonl"],
        2,
        'attnserve bench serve: error: argument --prompt-file: {tmp}/nokey.jsonl:3: missing key "prompt" (its keys: '
        f'"text"); {PROMPT_LINE}',
    ),
    (
        ["bench", "serve", "--model", "m", "--dataset", "file", "--prompt-file", "{tmp}/badjson.jsonl"],
        2,
        "attnserve bench serve: error: argument --prompt-file: {tmp}/badjson.jsonl:2:14: malformed JSON: Expecting "
        f"property name enclosed in double quotes; {PROMPT_LINE}",
    ),  # was "Expecting ...: line 1 column 14 (char 13)"
    # generate reads a prompts file as the benchmarks do (a JSONL line's "prompt"; the raw line was the prompt)
    (
        ["generate", "--prompts-file", "{tmp}/nokey.jsonl"],
        2,
        'attnserve generate: error: argument --prompts-file: {tmp}/nokey.jsonl:3: missing key "prompt" (its keys: '
        f'"text"); {PROMPT_LINE}',
    ),
    # --prompt-file alone is read (it implies --dataset file; it was ignored, random prompts sent instead)
    (
        ["bench", "serve", "--model", "m", "--prompt-file", "{tmp}/nokey.jsonl"],
        2,
        'attnserve bench serve: error: argument --prompt-file: {tmp}/nokey.jsonl:3: missing key "prompt" (its keys: '
        f'"text"); {PROMPT_LINE}',
    ),
    (
        ["bench", "serve", "--model", "m", "--dataset", "random", "--prompt-file", "{tmp}/nokey.jsonl"],
        2,
        "attnserve bench serve: error: argument --prompt-file: not used with --dataset random (leave --dataset out, or "
        "give --dataset file)",
    ),
    (
        ["bench", "throughput", "--model", "{tiny}", "--device", "cpu", "--prompts-file", "{tmp}/nokey.jsonl"],
        2,
        'attnserve bench throughput: error: argument --prompts-file: {tmp}/nokey.jsonl:3: missing key "prompt" (its '
        f'keys: "text"); {PROMPT_LINE}',
    ),  # was the line sent as a text prompt
]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "bad.yaml").write_text("a: [1\n")
    (tmp_path / "dtype.yaml").write_text("dtype: float64\n")
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "list.yaml").write_text("- dtype: float32\n")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("\n  \n\t\n")
    (tmp_path / "triton.yaml").write_text("attention_backend: TRITON_ATTN\n")
    (tmp_path / "fp8.yaml").write_text("kv_cache_dtype: fp8\nattention_config:\n  use_prefill_decode_attention: true\n")
    (tmp_path / "nokey.jsonl").write_text('{"prompt": "a"}\n\n{"text": "b"}\n')
    (tmp_path / "badjson.jsonl").write_text('{"prompt": "a"}\n{"prompt": 1,}\n')
    (tmp_path / "small_kv.yaml").write_text("kv_cache_memory: 10\n")
    (tmp_path / "gib.yaml").write_text("max_model_len: 8KiB\n")
    (tmp_path / "two_blocks.yaml").write_text("num_gpu_blocks_override: 2\n")
    (tmp_path / "latin1.txt").write_bytes("first\n\ncaf\u00e9\n".encode("latin-1"))  # é is 0xe9, at offset 10
    return tmp_path


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """``attnserve ARGV`` in this process: the exit status, stdout and stderr, as the interpreter would give them."""
    try:
        rc = main(argv)
    except SystemExit as e:
        if isinstance(e.code, str):  # the interpreter prints the message and exits 1
            out, err = capsys.readouterr()
            return 1, out, err + e.code + "\n"
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("argv, status, line", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_exits_with_one_line(argv, status, line, files, tiny_model_dir, capsys):
    tiny = tiny_model_dir("llama") if "{tiny}" in argv else ""
    tiny_gpt2 = tiny_model_dir("gpt2") if "{tiny_gpt2}" in argv else ""
    fill = lambda s: (
        s.replace("{tmp}", str(files))
        .replace("{tiny}", tiny)
        .replace("{tiny_gpt2}", tiny_gpt2)  # noqa: E731
        .replace("{cpu}", detect_platform("cpu").description)
    )
    capsys.readouterr()  # what making the tiny model wrote
    rc, out, err = run([fill(a) for a in argv], capsys)
    assert rc == status
    if "--json" in argv:  # stdout stays a JSON document, or is empty
        assert out == "" or json.loads(out)
    if line.endswith("(choose from "):  # the choices' quoting differs between Python versions
        assert err.startswith(line) and err.count("\n") == 1
    else:
        assert err == fill(line) + "\n"


@pytest.mark.parametrize("cmd", ["generate", "serve"])
def test_a_kv_cache_beyond_the_machines_memory_exits_with_one_line(cmd, tiny_model_dir, capsys):
    """``--num-gpu-blocks 10**20`` (vLLM's spelling) is one line naming the flag, the sizes and what fits; before, torch's
    overflow traceback or the kernel's OOM kill (serve: refused before the server listens). The memory available
    varies with the machine: the numbers are matched as numbers."""
    import re

    tiny = tiny_model_dir("llama")
    capsys.readouterr()
    model = [tiny] if cmd == "serve" else ["--model", tiny, "--prompt", "hi"]
    argv = [cmd, *model, "--device", "cpu", "--num-gpu-blocks-override", str(10**20)] + (
        ["--port", "0"] if cmd == "serve" else []
    )
    rc, out, err = run(argv, capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert re.fullmatch(
        rf"attnserve {cmd}: error: argument --num-gpu-blocks-override: a KV cache of 100000000000000000000 "
        r"blocks \(\d+\.\d\d GiB\) does not fit in the \d+\.\d\d GiB of cpu memory available now "
        r"\(\d+ blocks? fits?\); lower --num-gpu-blocks-override\n",
        err,
    ), err

"""``attnserve generate``: the README's main job, output JSON, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attnserve.entrypoints.cli.main import main
from tests.helpers import Refuses, assert_cli_refusal


def test_default_command_answers_the_default_chat_prompt(tmp_path):
    out_json = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "attnserve", "generate", "--max-tokens", "24", "--output-json", str(out_json)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out_json.read_text())
    (request,) = data["requests"]
    text = request["outputs"][0]["text"]
    assert text.strip() and proc.stdout.strip() == text.strip()  # streamed text == the final text
    assert "<|im_start|>user" in request["prompt"]  # the default prompt goes through the chat template
    assert data["stats"]["attention_backend"] == "CPU_ATTN"
    assert data["stats"]["generated_tokens"] == len(request["outputs"][0]["token_ids"]) <= 24


def test_several_prompts_write_every_request(tmp_path, tiny_model_dir):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text('hello there\n\n{"prompt": "the sky is", "id": 7}\nnumbers: 1 2 3\n')  # text and JSONL lines
    out_json = tmp_path / "out.json"
    rc = main(
        [
            "generate",
            "--model",
            tiny_model_dir("llama"),
            "--prompts-file",
            str(prompts),
            "--max-tokens",
            "5",
            "--ignore-eos",
            "--n",
            "2",
            "--temperature",
            "0.7",
            "--seed",
            "3",
            "--logprobs",
            "2",
            "--output-json",
            str(out_json),
        ]
    )
    assert rc == 0
    data = json.loads(out_json.read_text())
    assert [r["prompt"] for r in data["requests"]] == ["hello there", "the sky is", "numbers: 1 2 3"]
    for r in data["requests"]:
        assert [len(o["token_ids"]) for o in r["outputs"]] == [5, 5]
        assert all(len(o["logprobs"]) == 5 for o in r["outputs"])
        for o in r["outputs"]:  # the sampled tokens' logprobs summed
            total = 0.0
            for t, step in zip(o["token_ids"], o["logprobs"]):
                total += step[str(t)]["logprob"]
            assert o["cumulative_logprob"] == total
        assert r["ttft_s"] > 0 and r["e2e_s"] >= r["ttft_s"]


def test_sampling_flags_reach_the_output(tmp_path, tiny_model_dir):
    out_json = tmp_path / "out.json"
    rc = main(
        [
            "generate",
            "--model",
            tiny_model_dir("llama"),
            "--prompt",
            "hello there",
            "--max-tokens",
            "4",
            "--ignore-eos",
            "--logit-bias",
            "7=100",
            "--prompt-logprobs",
            "1",
            "--truncate-prompt-tokens",
            "2",
            "--repetition-penalty",
            "1.3",
            "--output-json",
            str(out_json),
        ]
    )
    assert rc == 0
    (r,) = json.loads(out_json.read_text())["requests"]
    assert r["outputs"][0]["token_ids"] == [7] * 4 and len(r["prompt_token_ids"]) == 2
    assert r["prompt_logprobs"][0] is None and len(r["prompt_logprobs"]) == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--max-tokens", "0"],
            Refuses("argument --max-tokens", 0, "integer >= 1"),
        ),
        (["--top-p", "0"], Refuses("argument --top-p", 0.0, "number in (0, 1]")),
        # the flag names the parameter; the value is the one stop string refused (was "argument --stop: stop [''] ...")
        (["--stop", ""], Refuses("argument --stop", "", "non-empty strings")),
        (
            ["--stop", "a", "--stop", ""],
            Refuses("argument --stop", "", "non-empty strings"),
        ),
        # every surface's words for an empty prompt (was "an empty prompt (give text, or leave --prompt out for ...)")
        (
            ["--prompt", ""],
            Refuses("argument --prompt", "", "a prompt of at least 1 token"),
        ),
        (
            ["--min-tokens", "20", "--max-tokens", "5"],
            Refuses("argument --min-tokens", 20, "integer >= 0, at most max_tokens"),
        ),
        (
            ["--logit-bias", "5"],
            Refuses("argument --logit-bias", "5", "TOKEN_ID=BIAS"),
        ),
        # logprobs go to --output-json only: without it they were computed and dropped without a word
        (["--logprobs", "2"], Refuses("argument --logprobs", 2, path=("logprobs",))),
        (["--prompt-logprobs", "0"], Refuses("argument --prompt-logprobs", 0, path=("prompt_logprobs",))),
        (
            ["--model", "/no/such/dir"],
            "attnserve generate: error: model '/no/such/dir' not found: give a folder with config.json and safetensors, a .gguf file, or a Hugging Face Hub id (org/name)",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, message, capsys, worded):
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(["generate", *argv]))
    assert e.value.code == 2
    assert_cli_refusal(capsys.readouterr().err, "attnserve generate", message, worded)


def test_prompt_longer_than_max_model_len(tiny_model_dir, capsys):
    rc = main(["generate", "--model", tiny_model_dir("llama"), "--max-model-len", "8", "--prompt", "word " * 20])
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (after the fixture's own output, when it made the model)
    assert rc == 2
    # the words of LLM.generate and the server (OpenAI's), the flag named (was "prompt has 21 tokens; max_model_len
    # is 8, so at most 7 prompt tokens fit (one place is the generated token's); raise --max-model-len or ...")
    assert err == (
        "attnserve generate: error: argument --max-model-len: This model's maximum context length is 8 "
        "tokens. However, the prompt has 21 tokens, which leaves no room for the completion (at most 7 prompt "
        "tokens fit). Please raise --max-model-len or reduce the length of the prompt."
    )


def test_max_tokens_beyond_the_context_is_refused(tiny_model_dir, capsys):
    """A prompt that fits, but not with --max-tokens more: refused as the server and LLM.generate refuse it (was run,
    and cut short at max_model_len); one line naming --max-tokens, exit status 2."""
    rc = main(
        [
            "generate",
            "--model",
            tiny_model_dir("llama"),
            "--max-model-len",
            "16",
            "--prompt",
            "word " * 5,
            "--max-tokens",
            "12",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2
    assert err == (
        "attnserve generate: error: argument --max-tokens: This model's maximum context length is 16 tokens. "
        "However, you requested 18 tokens (6 in the prompt, 12 in the completion). Please reduce the length of "
        "the prompt or completion."
    )


def _generate(model: str, *flags: str) -> subprocess.CompletedProcess:
    """``attnserve generate`` in its own process: its stderr is everything the user sees, log lines included."""
    return subprocess.run(
        [sys.executable, "-m", "attnserve", "generate", "--model", model, "--device", "cpu", *flags],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_prompt_the_kv_cache_cannot_hold_is_one_error_line(tiny_model_dir):
    """1 block of 4 tokens: one line, which says how many prompt tokens fit and names the flag; the warning that
    the KV cache is shorter than max_model_len no longer comes before it."""
    proc = _generate(
        tiny_model_dir("llama"), "--num-gpu-blocks", "1", "--block-size", "4", "--prompt", "one two three four"
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr == (
        "attnserve generate: error: argument --num-gpu-blocks: prompt of 4 tokens needs 2 KV blocks "
        "(5 tokens with the one it generates), the KV cache has 1 (4 tokens), so at most 3 prompt "
        "tokens fit; raise --num-gpu-blocks\n"
    )
    assert proc.stdout == ""


def test_a_kv_cache_shorter_than_max_model_len_still_warns_when_the_prompts_fit(tiny_model_dir):
    """3 blocks of 4 tokens and a prompt that fits: the warning is still printed (a request ends at 12 tokens),
    before the generated text."""
    proc = _generate(
        tiny_model_dir("llama"),
        "--num-gpu-blocks",
        "3",
        "--block-size",
        "4",
        "--prompt",
        "one two",
        "--max-tokens",
        "20",
        "--ignore-eos",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[0] == (
        "the KV cache holds 12 tokens, fewer than max_model_len 512: a request ends (finish_reason length) when it "
        "reaches 12 tokens, and a prompt of 12 tokens or more is refused; give the KV cache more memory or lower "
        "max_model_len"
    )
    assert proc.stderr.splitlines()[1].startswith("[attnserve] 10 tokens in ")  # 2 prompt tokens + 10 = 12


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_cuda_on_a_machine_without_one_fails_before_loading(capsys):
    assert main(["generate", "--device", "cuda"]) == 2
    assert capsys.readouterr().err.strip() == (
        "attnserve generate: error: argument --device: cuda:0 requested but CUDA is not available on this "
        "machine (allowed: auto, cpu)"
    )


SPLIT_ERROR = (
    "tensor_parallel_size 4 cannot split 9 query heads over 3 KV heads: with fewer KV heads than ranks "
    "the ranks must be a multiple of the KV heads and divide each KV head's 3 query heads "
    "(allowed: 1, 2, 3, 9 for this model)"
)


@pytest.mark.parametrize(
    "command",
    [
        ["generate", "--prompt", "The capital of France is", "--max-tokens", "12", "--tensor-parallel-size", "4"],
        [
            "bench",
            "latency",
            "--batch-size",
            "1",
            "--input-len",
            "4",
            "--output-len",
            "2",
            "--num-iters",
            "1",
            "--num-iters-warmup",
            "0",
            "--compare-tensor-parallel-sizes",
            "1",
            "4",
        ],
    ],
)
def test_a_tensor_parallel_size_the_heads_cannot_split_exits_2_before_any_worker(command):
    """The default model (9 query heads, 3 KV heads) on 4 ranks: one line from its config, no worker started."""
    proc = subprocess.run(
        [sys.executable, "-m", "attnserve", *command, "--device", "cpu"], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    flag = "--compare-tensor-parallel-sizes" if command[0] == "bench" else "--tensor-parallel-size"
    # --tensor-parallel-size names the setting: the line does not name it again
    message = SPLIT_ERROR if command[0] == "bench" else SPLIT_ERROR.removeprefix("tensor_parallel_size ")
    assert proc.stderr.strip() == (
        f"attnserve {command[0]}{' latency' if command[0] == 'bench' else ''}: error: argument {flag}: {message}"
    )
    assert proc.stdout == ""


def test_the_python_api_says_the_same_in_a_value_error():
    from attnserve import LLM

    with pytest.raises(ValueError, match=r"^tensor_parallel_size 4 cannot split 9 query heads over 3 KV heads"):
        LLM(tensor_parallel_size=4, device="cpu")


@pytest.mark.parametrize(
    "command",
    [
        ["generate", "--max-tokens", "2", "--prompt", "hi"],
        [
            "bench",
            "latency",
            "--batch-size",
            "1",
            "--input-len",
            "4",
            "--output-len",
            "2",
            "--num-iters",
            "1",
            "--num-iters-warmup",
            "0",
            "--device",
            "cpu",
            "--no-progress",
        ],
        [
            "bench",
            "throughput",
            "--num-prompts",
            "2",
            "--input-len",
            "4",
            "--output-len",
            "2",
            "--device",
            "cpu",
            "--no-progress",
        ],
        ["bench", "attention", "--device", "cpu", "--batch-size", "1", "--context-lens", "16", "--no-progress"],
        ["bench", "serve", "--num-prompts", "1", "--port", "9"],
    ],
)
@pytest.mark.parametrize("flag", ["--output-json", "--plot"])
def test_an_output_file_in_a_missing_folder_exits_2_before_the_run(command, flag, tiny_model_dir):
    if flag == "--plot" and command[0] == "generate" or command[1:2] == ["serve"] and flag == "--plot":
        pytest.skip("no --plot here")
    model = (
        ["--model", tiny_model_dir("llama")]
        if command[:2] != ["bench", "attention"] and command[1:2] != ["serve"]
        else []
    )
    proc = subprocess.run(
        [sys.executable, "-m", "attnserve", *command, *model, flag, "/nonexistent/dir/out.json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    prog = "attnserve " + " ".join(command[:2] if command[0] == "bench" else command[:1])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip() == (
        f"{prog}: error: argument {flag}: '/nonexistent/dir/out.json' not allowed (allowed: a file path in an "
        "existing, writable folder; folder /nonexistent/dir does not exist)"
    )
    assert proc.stdout == ""


def test_a_stale_cached_gguf_config_is_dropped_and_converted_again(tiny_model_dir, tmp_path):
    """A cached GGUF config that does not fit the weights: one warning naming the cache folder, the entry is
    converted again from the GGUF, and the run succeeds (it used to end in 'checkpoint shape ... != expected')."""
    import os

    from attnserve.model_executor import gguf_cache
    from tests.models.tiny import write_gpt2_gguf

    folder = tiny_model_dir("gpt2")
    gguf_path = write_gpt2_gguf(folder, str(tmp_path / "tiny-gpt2-f32.gguf"))
    cache = tmp_path / "cache"
    env = {**os.environ, gguf_cache.CACHE_DIR_ENV: str(cache)}
    command = [
        sys.executable,
        "-m",
        "attnserve",
        "generate",
        "--model",
        gguf_path,
        "--tokenizer",
        folder,
        "--prompt",
        "hi",
        "--max-tokens",
        "2",
        "--device",
        "cpu",
        "--dtype",
        "float32",
    ]
    first = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    config_json = os.path.join(gguf_cache.part_folder(gguf_path, "config", str(cache)), "config.json")
    good = json.loads(open(config_json).read())
    stale = {**good, "n_inner": 3 * good["n_embd"]}  # the MLP no longer fits the checkpoint's tensors
    with open(config_json, "w") as f:
        json.dump(stale, f)

    second = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    entry = os.path.dirname(os.path.dirname(config_json))
    warnings = [line for line in second.stderr.splitlines() if "does not fit the weights" in line]
    assert len(warnings) == 1 and entry in warnings[0] and "checkpoint shape" in warnings[0], second.stderr[-3000:]
    assert json.loads(open(config_json).read()).get("n_inner") == good.get("n_inner")  # converted again


def test_chat_template_and_generation_config_flags(tmp_path, tiny_model_dir, capsys):
    template = "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}|{% endfor %}A:"
    (tmp_path / "generation_config.json").write_text(json.dumps({"max_new_tokens": 3, "temperature": 0.5}))
    out_json = tmp_path / "out.json"
    base = [
        "generate",
        "--model",
        tiny_model_dir("llama"),
        "--prompt",
        "Hi",
        "--ignore-eos",
        "--output-json",
        str(out_json),
    ]
    # --chat-template (the text here) puts the prompt in that template; --max-tokens left out: the generation
    # config's max_new_tokens
    assert main([*base, "--chat-template", template, "--generation-config", str(tmp_path)]) == 0
    (request,) = json.loads(out_json.read_text())["requests"]
    assert request["prompt"] == "user:Hi|A:" and len(request["outputs"][0]["token_ids"]) == 3
    # a flag given wins over the config, whose max_new_tokens still caps it (as the server caps max_tokens)
    assert main([*base, "--generation-config", str(tmp_path), "--max-tokens", "8"]) == 0
    assert len(json.loads(out_json.read_text())["requests"][0]["outputs"][0]["token_ids"]) == 3
    assert main([*base, "--generation-config", "vllm", "--max-tokens", "8"]) == 0
    assert len(json.loads(out_json.read_text())["requests"][0]["outputs"][0]["token_ids"]) == 8
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main([*base, "--chat-template", str(tmp_path / "missing.jinja")])
    assert e.value.code == 2
    assert "argument --chat-template: " in capsys.readouterr().err


def test_the_summary_line_names_an_fp8_cache(tiny_model_dir, capsys):
    """generate sets up no log handler, so the start-up KV-cache line may not show: the summary line names the
    cache's type where it is not the model's."""
    argv = ["generate", "--model", tiny_model_dir("llama"), "--device", "cpu", "--prompt", "one", "--max-tokens", "2"]
    capsys.readouterr()
    assert main([*argv, "--kv-cache-dtype", "fp8"]) == 0
    summary = capsys.readouterr().err.splitlines()[-1]
    assert summary.startswith("[attnserve] ") and ", float32, KV cache float8_e4m3fn; " in summary
    assert main(argv) == 0
    assert "KV cache" not in capsys.readouterr().err.splitlines()[-1]  # a 16-/32-bit cache: the model's type

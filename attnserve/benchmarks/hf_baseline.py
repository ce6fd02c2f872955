"""``--baseline transformers``: the same requests through transformers' ``generate`` in the same process.

The model comes from the same source as the engine's: a folder through ``AutoModelForCausalLM.
from_pretrained``, a GGUF through ``from_pretrained(gguf_file=...)``, ``--load-format dummy`` through
``from_config`` with random initialization (seeded). Same dtype, same device, transformers' default
attention (sdpa) and dynamic KV cache. Requests run as static batches, left-padded, greedy, with
``min_new_tokens = max_new_tokens`` so EOS never stops a row early (the engine's ``ignore_eos``).
"""

from __future__ import annotations

import gc
import importlib.util
import os
from dataclasses import dataclass

import torch

from attnserve.benchmarks.stats import now
from attnserve.model_executor.loader import ModelNotFoundError, ModelSource, resolve_model_source


def needs_accelerate(model: str | None, load_format: str) -> bool:
    """Whether transformers needs accelerate to load ``--model`` with ``load_format``: a GGUF does (the loader's
    own rule, :func:`resolve_model_source`, for the default model and local paths; a hub id is a folder);
    random weights do not. A model the loader cannot find is left to the engine's own error."""
    if load_format == "dummy" or (model is not None and not os.path.exists(os.path.expanduser(model))):
        return False
    try:
        return resolve_model_source(model).is_gguf  # local: nothing is downloaded
    except ModelNotFoundError:
        return False


def check_transformers_baseline(model: str | None, load_format: str) -> None:
    """Refused (path ``("baseline",)``) before any model loads when transformers cannot load the model here
    (:func:`needs_accelerate` and accelerate is not installed)."""
    from attnserve.refusals import Refused
    from attnserve.refusals.bench import TRANSFORMERS_GGUF_NEEDS_ACCELERATE

    if needs_accelerate(model, load_format) and importlib.util.find_spec("accelerate") is None:
        raise Refused(TRANSFORMERS_GGUF_NEEDS_ACCELERATE)


@dataclass(frozen=True)
class BatchTiming:
    """One ``generate`` call: how many rows, how many tokens each row generated, and the wall time."""

    batch_size: int
    new_tokens: int  # per row
    seconds: float


class TransformersBaseline:
    """A transformers model built like the engine's, and timed static-batch generation on it."""

    def __init__(
        self,
        source: ModelSource,
        hf_config,
        load_format: str,
        dtype: torch.dtype,
        device: torch.device,
        seed: int = 0,
        pad_token_id: int | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.device, self.dtype = device, dtype
        if load_format == "dummy":
            torch.manual_seed(seed)
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(source.folder, dtype=dtype, **source.hf_kwargs())
        self.model = model.to(device).eval()
        eos = getattr(hf_config, "eos_token_id", None)
        self.eos_token_id = eos[0] if isinstance(eos, list) else eos
        self.pad_token_id = pad_token_id if pad_token_id is not None else (self.eos_token_id or 0)

    def _inputs(self, prompts: list[list[int]]) -> dict[str, torch.Tensor]:
        """Left-padded ``input_ids`` and ``attention_mask`` of the batch."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        return {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], new_tokens: int) -> BatchTiming:
        """Generate exactly ``new_tokens`` tokens for every prompt in one static batch; time it."""
        from transformers import GenerationConfig

        config = GenerationConfig(
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=self.pad_token_id,
            eos_token_id=self.eos_token_id,
        )
        inputs = self._inputs(prompts)
        t0 = now(self.device)
        out = self.model.generate(**inputs, generation_config=config)
        seconds = now(self.device) - t0
        assert out.shape[1] - inputs["input_ids"].shape[1] == new_tokens, "generate stopped early"
        return BatchTiming(len(prompts), new_tokens, seconds)

    def close(self) -> None:
        """Free the model (and, on GPU, its cached memory)."""
        del self.model
        free_device_memory(self.device)


def free_device_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()

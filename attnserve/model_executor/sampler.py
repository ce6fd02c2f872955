"""Sampler: logits -> next tokens (greedy, temperature, top-k, top-p, min-p, per-request seeds) + logprobs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnserve.engine.sampling_params import SamplingParams


@dataclass
class SamplerOutput:
    """The step's sampled tokens and, for requests that asked, their logprobs."""

    token_ids: list[int]  # (B,) one sampled token per request
    # per request: None, or (sampled token logprob, sampled token rank, [(token_id, logprob)] top-k by logprob)
    logprobs: list[tuple[float, int, list[tuple[int, float]]] | None]


def apply_filters(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Mask (to -inf) the tokens top-k, then top-p, then min-p remove from one row ``(V,)`` float32."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the tokens before it already reach top_p (the first token always stays)
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
        drop_sorted[0] = False  # explicitly: a top_p below float32's smallest value rounds to 0 and would drop it
        logits = logits.masked_fill(torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted), float("-inf"))
    if min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.max(), float("-inf"))
    return logits


class Sampler:
    """Chooses one token per request row. Logprobs are of the model's raw distribution (vLLM's default)."""

    def __call__(
        self,
        logits: torch.Tensor,  # (B, V) float32
        params: list[SamplingParams],
        generators: list[torch.Generator | None],  # per row; None = the default generator
    ) -> SamplerOutput:
        greedy_ids = logits.argmax(dim=-1)
        token_ids = greedy_ids.tolist()
        for i, p in enumerate(params):
            if p.greedy:
                continue
            row = apply_filters(logits[i] / p.temperature, p.top_k, p.top_p, p.min_p)
            token_ids[i] = int(torch.multinomial(row.softmax(-1), 1, generator=generators[i]).item())
        want = [p.logprobs is not None for p in params]
        logprobs: list = [None] * len(params)
        if any(want):
            lp = torch.log_softmax(logits, dim=-1)
            for i, p in enumerate(params):
                if not want[i]:
                    continue
                sampled = lp[i, token_ids[i]]
                rank = int((lp[i] > sampled).sum().item()) + 1
                top = torch.topk(lp[i], p.logprobs) if p.logprobs else None
                top_list = list(zip(top.indices.tolist(), top.values.tolist())) if top is not None else []
                logprobs[i] = (float(sampled), rank, top_list)
        return SamplerOutput(token_ids=token_ids, logprobs=logprobs)

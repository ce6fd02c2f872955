"""Prompt logprobs (vLLM's ``prompt_logprobs``): the log probability of each prompt token after the ones before it.

A step that computes prompt positions ``p`` of a request that asked for them also keeps the final hidden states
at those positions; their logits give prompt token ``p + 1``'s logprob, its rank and the top-k (of the model's
raw distribution). The logits are computed in chunks of :data:`CHUNK` rows (a long prompt's would not fit).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from attnserve.core.step import SchedulerOutput

CHUNK = 1024  # rows of prompt logits at a time


@dataclass
class PromptLogprobsPlan:
    """Which of a step's tokens give prompt logprobs. N rows in all."""

    token_index: np.ndarray  # (N,) int64: flat index in the step's tokens of each row's position
    targets: np.ndarray  # (N,) int64: the prompt token that follows each position
    spans: list[tuple[str, int, int, int]]  # per request: (request id, index of its first entry, rows, top-k)

    @classmethod
    def of(cls, sched: SchedulerOutput) -> PromptLogprobsPlan | None:
        """The step's plan; None when no request computes prompt positions with prompt_logprobs."""
        index, targets, spans = [], [], []
        offset = 0
        for r in sched.requests:
            k = r.sampling_params.prompt_logprobs
            if k is not None and r.prompt_token_ids is not None:
                start = r.start_position
                end = min(start + len(r.token_ids), len(r.prompt_token_ids) - 1)  # positions with a next token
                if end > start:
                    index.append(np.arange(offset, offset + end - start, dtype=np.int64))
                    targets.append(np.asarray(r.prompt_token_ids[start + 1 : end + 1], dtype=np.int64))
                    spans.append((r.request_id, start, end - start, k))
            offset += len(r.token_ids)
        if not spans:
            return None
        return cls(np.concatenate(index), np.concatenate(targets), spans)

    def compute(
        self, hidden: torch.Tensor, compute_logits: Callable[[torch.Tensor], torch.Tensor], driver: bool
    ) -> dict[str, tuple[int, list]]:
        """``hidden`` (N, hidden) at the plan's rows -> per request ``(first entry index, entries)``, each entry
        ``(logprob, rank, [(token_id, logprob)] top-k)``; waits for the device. ``compute_logits`` runs on every
        rank (a vocabulary-split LM head gathers collectively); only the ``driver`` computes the entries ({}
        elsewhere)."""
        k_max = max(k for *_, k in self.spans)
        targets = torch.from_numpy(self.targets).to(hidden.device)
        parts = []
        for lo in range(0, hidden.shape[0], CHUNK):
            logits = compute_logits(hidden[lo : lo + CHUNK])
            if not driver:
                continue
            lp = torch.log_softmax(logits.float(), dim=-1)
            chosen = lp.gather(1, targets[lo : lo + CHUNK, None])
            rank = (lp > chosen).sum(dim=-1, keepdim=True) + 1
            top = lp.topk(k_max, dim=-1) if k_max else None
            cols = [chosen.double(), rank.double()]
            if top is not None:
                cols += [top.values.double(), top.indices.double()]
            parts.append(torch.cat(cols, dim=1).cpu())
        if not driver:
            return {}
        rows = torch.cat(parts).tolist()
        out, at = {}, 0
        for rid, first, n, k in self.spans:
            entries = []
            for row in rows[at : at + n]:
                top = [(int(t), v) for t, v in zip(row[2 + k_max : 2 + k_max + k], row[2 : 2 + k])]
                entries.append((row[0], int(row[1]), top))
            out[rid] = (first, entries)
            at += n
        return out

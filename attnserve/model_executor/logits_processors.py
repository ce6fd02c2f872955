"""Logits processing before sampling, with vLLM's rules and order: allowed_token_ids, bad_words, logit_bias,
min_tokens, then the penalties (repetition, frequency, presence; vLLM ``v1/sample/sampler.py``
``apply_logits_processors`` and ``ops/penalties.py``).

The penalties (``kernels/penalties.py``: one Triton kernel on CUDA) read per-request token state kept on the device: ``counts`` (slots, V) int32, how often each
token occurs in the request's output, and ``prompt_mask`` (slots, V) bool, which tokens its prompt holds. A
request with penalties takes a slot when it is (re)admitted (filled from its known tokens, one host->device
copy) and each step's sampled tokens are added on the device (:meth:`LogitsProcessors.record`): no host round
trip per step, and the tokens of the step in flight (async scheduling) are already counted when the next step
samples. Slots are freed when a request finishes or is preempted.

The other rules are small per-step index tensors built on the host (pinned, non-blocking copies). A
multi-token bad word whose prefix ends with the pending token (async scheduling: not yet on the host)
compares that token on the device.
"""

from __future__ import annotations

import torch

from attnserve.core.step import ScheduledRequest
from attnserve.kernels.penalties import apply_penalties

_NEG_INF = float("-inf")


def _to_device(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    cpu = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return cpu.pin_memory().to(device, non_blocking=True)
    return cpu.to(device)


def _flat(pairs: list[tuple[int, int]], vocab: int, device: torch.device) -> torch.Tensor:
    """(row, token) pairs as flat indices into a (rows, vocab) tensor's ``view(-1)`` (int64, on ``device``):
    index_fill_ / scatter on them queue without a host sync, as advanced-index assignment may not."""
    return _to_device([j * vocab + t for j, t in pairs], torch.int64, device)


class LogitsProcessors:
    """The step's logits rules, and the device token state the penalties read. One per model runner (rank 0)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.counts: torch.Tensor | None = None  # (slots, V) int32, allocated at the first request with penalties
        self.prompt_mask: torch.Tensor | None = None  # (slots, V) bool
        self.slots: dict[str, int] = {}
        self._free: list[int] = []

    @staticmethod
    def needed(reqs: list[ScheduledRequest]) -> bool:
        """Whether any of the step's sampling requests has its logits changed."""
        return any(r.sampling_params.changes_logits for r in reqs)

    def free(self, request_ids: list[str]) -> None:
        """Give back the slots of finished or preempted requests."""
        for rid in request_ids:
            slot = self.slots.pop(rid, None)
            if slot is not None:
                self._free.append(slot)

    def admit(self, reqs: list[ScheduledRequest], vocab: int) -> None:
        """Give each request with penalties that has none a slot, filled from its known tokens (any step's
        requests: a partial prefill does not sample, but its slot is filled before it does)."""
        for r in reqs:
            if not r.sampling_params.has_penalties or r.request_id in self.slots:
                continue
            assert r.prompt_token_ids is not None, "a request with penalties is admitted with its tokens"
            slot = self._take_slot(vocab)
            self.slots[r.request_id] = slot
            self.prompt_mask[slot].zero_()
            self.prompt_mask[slot].index_fill_(0, _to_device(r.prompt_token_ids, torch.int64, self.device), True)
            self.counts[slot].zero_()
            if r.output_token_ids:
                ids = _to_device(r.output_token_ids, torch.int64, self.device)
                self.counts[slot].scatter_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))

    def _take_slot(self, vocab: int) -> int:
        if not self._free:  # grow: double the rows (a copy; rare, the number of running requests is bounded)
            old = 0 if self.counts is None else self.counts.shape[0]
            new = max(8, 2 * old)
            counts = torch.zeros(new, vocab, dtype=torch.int32, device=self.device)
            mask = torch.zeros(new, vocab, dtype=torch.bool, device=self.device)
            if old:
                counts[:old].copy_(self.counts)
                mask[:old].copy_(self.prompt_mask)
            self.counts, self.prompt_mask = counts, mask
            self._free.extend(range(new - 1, old - 1, -1))
        return self._free.pop()

    def __call__(
        self,
        logits: torch.Tensor,  # (R, V) the sampling rows' logits, any float dtype; not modified
        reqs: list[ScheduledRequest],  # the R sampling requests, in row order
        last_tokens: torch.Tensor | None,  # the last step's samples on the device (pending tokens), or None
        last_rows: dict[str, int],  # each request's row in last_tokens
    ) -> torch.Tensor:  # (R, V) float32: a new tensor, or ``logits`` itself when no request changes its logits
        """Apply every request's rules, in vLLM's order."""
        if not self.needed(reqs):
            return logits
        out = logits.float()
        if out is logits:
            out = logits.clone()
        vocab = out.shape[1]
        dev = self.device
        params = [r.sampling_params for r in reqs]
        # allowed_token_ids: every other token -inf
        allowed = [(j, p.allowed_token_ids) for j, p in enumerate(params) if p.allowed_token_ids is not None]
        if allowed:
            keep = torch.zeros(len(allowed), vocab, dtype=torch.bool, device=dev)
            keep.view(-1).index_fill_(
                0, _flat([(i, t) for i, (_, ids) in enumerate(allowed) for t in ids], vocab, dev), True
            )
            if len(allowed) == len(reqs):
                out.masked_fill_(~keep, _NEG_INF)
            else:
                index = _to_device([j for j, _ in allowed], torch.int64, dev)
                out.index_copy_(0, index, out.index_select(0, index).masked_fill_(~keep, _NEG_INF))
        self._bad_words(out, reqs, last_tokens, last_rows)
        # logit_bias: added (one entry per row and token: a dict)
        bias = [(j, t, b) for j, p in enumerate(params) for t, b in (p.logit_bias or {}).items()]
        if bias:
            out.view(-1).scatter_add_(
                0,
                _flat([(j, t) for j, t, _ in bias], vocab, dev),
                _to_device([b for *_, b in bias], torch.float32, dev),
            )
        # min_tokens: EOS (unless ignore_eos) and the stop token ids masked while the output is shorter
        banned = []
        for j, r in enumerate(reqs):
            p = r.sampling_params
            if r.num_output_tokens < p.min_tokens:
                stop_ids = set(p.stop_token_ids)
                if not p.ignore_eos and r.eos_token_id is not None:
                    stop_ids.add(r.eos_token_id)
                banned.extend((j, t) for t in sorted(stop_ids))
        if banned:
            out.view(-1).index_fill_(0, _flat(banned, vocab, dev), _NEG_INF)
        self._penalties(out, reqs)
        return out

    def _bad_words(self, out: torch.Tensor, reqs: list[ScheduledRequest], last_tokens, last_rows) -> None:
        """vLLM's ``apply_bad_words``: a word's last token is -inf where the output ends with the rest of it."""
        always: list[tuple[int, int]] = []  # (row, token): banned now
        pending: list[tuple[int, int, int, int]] = []  # (row, token, last-step row, expected pending token)
        for j, r in enumerate(reqs):
            words = r.sampling_params.bad_words_token_ids
            if not words:
                continue
            known = r.recent_output_ids or []  # the last known output tokens (enough for the longest prefix)
            for w in words:
                prefix = w[:-1]
                if len(prefix) > r.num_output_tokens:
                    continue
                if not prefix:
                    always.append((j, w[-1]))
                elif r.output_pending:  # the prefix's last token is the one in flight: compared on the device
                    if known[len(known) - len(prefix) + 1 :] == prefix[:-1]:
                        pending.append((j, w[-1], last_rows[r.request_id], prefix[-1]))
                elif known[len(known) - len(prefix) :] == prefix:
                    always.append((j, w[-1]))
        dev, vocab = self.device, out.shape[1]
        if always:
            out.view(-1).index_fill_(0, _flat(always, vocab, dev), _NEG_INF)
        if pending:
            flat = _flat([(j, t) for j, t, *_ in pending], vocab, dev)
            src, expected = (_to_device(x, torch.int64, dev) for x in list(zip(*pending))[2:])
            hit = last_tokens.index_select(0, src) == expected
            # min with -inf where the pending token completes the prefix (+inf: unchanged); a token banned by two
            # words is -inf when either matches
            out.view(-1).scatter_reduce_(0, flat, torch.where(hit, _NEG_INF, float("inf")), reduce="amin")

    def _penalties(self, out: torch.Tensor, reqs: list[ScheduledRequest]) -> None:
        rows = [j for j, r in enumerate(reqs) if r.sampling_params.has_penalties]
        if not rows:
            return
        dev = self.device
        params = [reqs[j].sampling_params for j in rows]

        def column(values: list[float], off: float) -> torch.Tensor | None:  # (P,) float32, None when all off
            return None if all(v == off for v in values) else _to_device(values, torch.float32, dev)

        apply_penalties(
            out,
            _to_device(rows, torch.int64, dev),
            _to_device([self.slots[reqs[j].request_id] for j in rows], torch.int64, dev),
            self.counts,
            self.prompt_mask,
            column([p.presence_penalty for p in params], 0.0),
            column([p.frequency_penalty for p in params], 0.0),
            column([p.repetition_penalty for p in params], 1.0),
        )

    def record(self, reqs: list[ScheduledRequest], token_ids: torch.Tensor) -> None:
        """Count the step's sampled tokens ``token_ids`` (R,) int64 (device) for the requests with penalties."""
        rows = [j for j, r in enumerate(reqs) if r.request_id in self.slots]
        if not rows:
            return
        dev = self.device
        slots = _to_device([self.slots[reqs[j].request_id] for j in rows], torch.int64, dev)
        tokens = token_ids if len(rows) == len(reqs) else token_ids.index_select(0, _to_device(rows, torch.int64, dev))
        vocab = self.counts.shape[1]
        self.counts.view(-1).scatter_add_(0, slots * vocab + tokens, torch.ones_like(tokens, dtype=torch.int32))

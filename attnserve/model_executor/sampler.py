"""Sampler: logits -> next tokens (greedy, temperature, top-k, top-p, min-p, per-request seeds) + logprobs.

Batched on the logits' device: per-row parameters become one small tensor (or Python scalars when every
row shares a value), the filters are vectorized, and sampling is the exponential race
``argmax(probs / q)``, ``q ~ Exponential(1)`` i.i.d. per token, which picks token ``i`` with probability
``probs[i] / sum(probs)`` (vLLM, nano-vllm). It needs no normalized distribution and no host sync; the
noise of all unseeded rows is one draw from the shared generator, a seeded row draws its own ``(V,)``
noise from its request's generator, so its tokens depend only on its seed and logits, not on the batch.

The argmax on CUDA is one Triton kernel (``kernels/triton_argmax.py``, faster than torch's), elsewhere
``torch.argmax``; both return each row's first maximum.

The host sees exactly one device->host copy of the sampled token ids, plus one for the logprobs of the
rows that asked for them; :meth:`Sampler.sample` only queues them (async scheduling reads them one step
later), :meth:`Sampler.__call__` waits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnserve.core.sampling_params import SamplingParams
from attnserve.kernels.argmax import argmax_rows


@dataclass
class SamplerOutput:
    """The step's sampled tokens and, for requests that asked, their logprobs."""

    token_ids: list[int]  # (B,) one sampled token per request
    # per request: None, or (sampled token logprob, sampled token rank, [(token_id, logprob)] top-k by logprob)
    logprobs: list[tuple[float, int, list[tuple[int, float]]] | None]


@dataclass(frozen=True)
class SamplerRows:
    """Which rows of a batch sample at random (temperature > 0) and which want logprobs, from the rows' params."""

    random: list[int]  # rows with temperature > 0
    want: list[int]  # rows that asked for logprobs
    ks: list[int]  # their logprobs counts

    @staticmethod
    def of(params: list[SamplingParams]) -> SamplerRows:
        want = [i for i, p in enumerate(params) if p.logprobs is not None]
        return SamplerRows(
            [i for i, p in enumerate(params) if p.temperature != 0.0], want, [params[i].logprobs for i in want]
        )


def _to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    cpu = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":  # pinned + non_blocking: the copy does not wait for the forward pass to end
        return cpu.pin_memory().to(device, non_blocking=True)
    return cpu.to(device)


def _column(values: list[float], device: torch.device) -> float | torch.Tensor:
    """One per-row parameter: a Python scalar when every row has the same value, else ``(R, 1)`` float32."""
    first = values[0]
    if all(v == first for v in values):
        return first
    return _to_device(values, torch.float32, device)[:, None]


def _exponential_(noise: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Fill ``noise`` with Exponential(1) draws, in place."""
    if noise.device.type == "cpu":  # -log(U): faster than exponential_ on the CPU
        return noise.uniform_(generator=generator).log_().neg_()
    return noise.exponential_(generator=generator)  # one kernel


def apply_filters(
    logits: torch.Tensor,  # (R, V) float32, already divided by the temperature; not modified
    top_k: list[int],  # per row; 0 = off
    top_p: list[float],  # per row; 1.0 = off
    min_p: list[float],  # per row; 0.0 = off
) -> torch.Tensor:  # (R, V) float32 probabilities, unnormalized after min-p; filtered tokens exactly 0
    """Top-k, then top-p, then min-p (vLLM's order), each row with its own values."""
    vocab = logits.shape[-1]
    dev = logits.device
    use_k = any(0 < k < vocab for k in top_k)
    use_p = any(p < 1.0 for p in top_p)
    neg_inf = float("-inf")
    if use_p:  # one sort serves top-k and top-p
        if all(0 < k < vocab for k in top_k):  # only the k_max most likely can stay: sort just those
            width = max(top_k)
            sorted_logits, order = logits.topk(width, dim=-1)  # descending
        else:
            width = vocab
            sorted_logits, order = logits.sort(dim=-1, descending=True)
        if use_k:
            k = _column([k if 0 < k < vocab else width for k in top_k], dev)
            k_index = (k - 1).long() if isinstance(k, torch.Tensor) else torch.full((len(top_k), 1), k - 1, device=dev)
            kth = sorted_logits.gather(1, k_index)
            sorted_logits.masked_fill_(sorted_logits < kth, neg_inf)  # ties with the k-th stay
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each token
        # a row without top-p gets an unreachable threshold: float32 rounding must not cut its tail
        drop = before >= _column([p if p < 1.0 else float("inf") for p in top_p], dev)
        drop[:, 0] = False  # the most likely token always stays (also when top_p rounds to 0)
        sorted_logits.masked_fill_(drop, neg_inf)
        logits = torch.full_like(logits, neg_inf).scatter_(1, order, sorted_logits)
    elif use_k:
        ks = [k if 0 < k < vocab else 0 for k in top_k]
        k_max = max(ks)
        top = logits.topk(k_max, dim=-1).values  # (R, k_max) descending
        k = _column([float(k) for k in ks], dev)
        if isinstance(k, torch.Tensor):
            kth = top.gather(1, (k.long() - 1).clamp_min(0))
            kth = kth.masked_fill(k == 0, neg_inf)  # rows without top-k keep everything
        else:
            kth = top[:, k_max - 1 : k_max]
        logits = logits.masked_fill(logits < kth, neg_inf)
    probs = logits.softmax(dim=-1)
    if any(m > 0.0 for m in min_p):
        threshold = _column(min_p, dev)
        # zeroing without renormalizing is enough: argmax(probs / q) does not change when a row is scaled
        probs = probs.masked_fill(probs < threshold * probs.amax(dim=-1, keepdim=True), 0.0)
    return probs


@dataclass
class DeviceSample:
    """A step's sampled tokens still on the device, their copy to the host under way (non-blocking).

    ``result()`` waits for that copy only (not for work queued after the step) and unpacks it.
    """

    token_ids: torch.Tensor  # (B,) int64 on the logits' device
    _ids_host: torch.Tensor  # (B,) int64, pinned when the device is a GPU
    _packed_host: torch.Tensor | None  # (len(want), 2 + 2 k_max) float64, see Sampler._logprobs
    _want: list[int]  # rows that asked for logprobs
    _ks: list[int]  # their top-k counts
    _event: torch.cuda.Event | None  # recorded after the copies (GPU only)

    def result(self) -> SamplerOutput:
        if self._event is not None:
            self._event.synchronize()
        logprobs: list = [None] * len(self._ids_host)
        if self._packed_host is not None:
            ids_at = 2 + (self._packed_host.shape[1] - 2) // 2  # column of the first top-k id
            for i, k, row in zip(self._want, self._ks, self._packed_host.tolist()):
                top = [(int(t), v) for t, v in zip(row[ids_at : ids_at + k], row[2 : 2 + k])]
                logprobs[i] = (row[0], int(row[1]), top)
        return SamplerOutput(token_ids=self._ids_host.tolist(), logprobs=logprobs)


def _to_host_async(t: torch.Tensor) -> torch.Tensor:
    """A device->host copy into pinned memory that does not block the host (on the current stream)."""
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t, non_blocking=True)


class Sampler:
    """Chooses one token per request row. Logprobs are of the model's raw distribution (vLLM's default)."""

    def __init__(self) -> None:
        self._copy_streams: dict[torch.device, torch.cuda.Stream] = {}  # per device, for the host copies

    def __call__(
        self,
        logits: torch.Tensor,  # (B, V) float32, or the model's 16-bit dtype (upcast where needed); not modified
        params: list[SamplingParams],
        generators: list[torch.Generator | None],  # per row; unseeded rows share one (None = torch's default)
        raw_logits: torch.Tensor | None = None,
    ) -> SamplerOutput:
        """Sample and wait for the tokens (the one host-device synchronisation of a step)."""
        return self.sample(logits, params, generators, raw_logits).result()

    def sample(
        self,
        logits: torch.Tensor,  # (B, V) as in __call__; not modified
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        raw_logits: torch.Tensor | None = None,  # (B, V) the model's logits when ``logits`` are processed ones
        rows: SamplerRows | None = None,  # ``SamplerRows.of(params)``, when the caller keeps it
    ) -> DeviceSample:
        """Queue the sampling kernels and the copy of their results to the host; does not wait for them.
        Logprobs are of ``raw_logits`` when given (vLLM's raw_logprobs: before penalties, bias and masks)."""
        num_rows = len(params)
        rows = rows if rows is not None else SamplerRows.of(params)
        random_rows = rows.random
        if len(random_rows) == num_rows:
            token_ids = self._sample(logits, params, generators)
        else:
            token_ids = argmax_rows(logits)
            if random_rows:
                index = _to_device(random_rows, torch.int64, logits.device)
                token_ids[index] = self._sample(
                    logits[index], [params[i] for i in random_rows], [generators[i] for i in random_rows]
                )
        want, ks = rows.want, rows.ks
        packed = self._logprobs(logits if raw_logits is None else raw_logits, token_ids, ks, want) if want else None
        return self.queue(token_ids, packed, want, ks)

    def queue(
        self,
        token_ids: torch.Tensor,
        packed: torch.Tensor | None = None,
        want: list[int] | None = None,
        ks: list[int] | None = None,
    ) -> DeviceSample:
        """Sampled ``token_ids`` (B,) int64 (and ``packed`` logprobs of rows ``want``, ``ks`` each) as a
        :class:`DeviceSample`: on CUDA their copies to the host are queued on a side stream, not waited for.
        Also the entry for tokens sampled elsewhere (the model's fused greedy head)."""
        want, ks = want or [], ks or []
        if token_ids.device.type != "cuda":
            return DeviceSample(token_ids, token_ids, packed, want, ks, None)
        # the copies to the host go on a side stream: the next step's kernels, queued behind this step on the
        # current stream, need not wait for a copy-engine round trip
        main = torch.cuda.current_stream(token_ids.device)
        copies = self._host_copy_stream(token_ids.device)
        copies.wait_stream(main)
        with torch.cuda.stream(copies):
            ids_host = _to_host_async(token_ids)
            packed_host = _to_host_async(packed) if packed is not None else None
            event = torch.cuda.Event()
            event.record(copies)
        for t in (token_ids, packed):  # the caching allocator must not hand them out before the copy read them
            if t is not None:
                t.record_stream(copies)
        return DeviceSample(token_ids, ids_host, packed_host, want, ks, event)

    def _host_copy_stream(self, device: torch.device) -> torch.cuda.Stream:
        """The side stream of ``device`` for copies of sampled tokens to the host (made on first use)."""
        if device not in self._copy_streams:
            self._copy_streams[device] = torch.cuda.Stream(device)
        return self._copy_streams[device]

    @staticmethod
    def _sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]):
        """Rows with temperature > 0: scale, filter, exponential race. Returns ``(R,)`` int64 on device."""
        temperature = _column([p.temperature for p in params], logits.device)
        probs = apply_filters(
            logits.float() / temperature,
            [p.top_k for p in params],
            [p.top_p for p in params],
            [p.min_p for p in params],
        )
        seeded = [i for i, p in enumerate(params) if p.seed is not None]
        noise = torch.empty_like(probs)
        if len(seeded) < len(params):  # one draw for every unseeded row (seeded rows overwrite theirs)
            shared = next(g for g, p in zip(generators, params) if p.seed is None)
            _exponential_(noise, shared)
        for i in seeded:
            _exponential_(noise[i], generators[i])
        # a draw can be exactly 0; a filtered token has probability exactly 0 and stays last
        return argmax_rows(probs.div_(noise.clamp_min_(1e-20)))

    @staticmethod
    def _logprobs(logits: torch.Tensor, token_ids: torch.Tensor, ks: list[int], rows: list[int]) -> torch.Tensor:
        """``(n, 2 + 2 k_max)`` float64 on device: sampled logprob, its rank, top-k logprobs, top-k ids."""
        if len(rows) < logits.shape[0]:
            index = _to_device(rows, torch.int64, logits.device)
            logits, token_ids = logits[index], token_ids[index]
        lp = torch.log_softmax(logits.float(), dim=-1)
        sampled = lp.gather(1, token_ids[:, None])
        rank = (lp > sampled).sum(dim=-1, keepdim=True) + 1
        top = lp.topk(max(ks), dim=-1)
        # float64 holds float32 logprobs and integer ranks / ids (< 2**53) exactly: one copy for all
        return torch.cat([sampled.double(), rank.double(), top.values.double(), top.indices.double()], dim=1)

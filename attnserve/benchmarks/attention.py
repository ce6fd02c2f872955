"""``attnserve bench attention``: each usable attention backend's Impl.forward on decode and prefill shapes.

Backends: those of the platform's priority list (or ``--backends``) that the selector finds usable for the
shape (``evaluate_backends``); the others are listed with their reasons. A backend whose Builder or Impl
raises NotImplementedError gets a row with status "not implemented"; any other exception a row "error:
...". The command never stops on one backend's failure, so it runs unchanged on CPU and on a GPU.

Shapes, over a paged cache with block tables in random order (``tests/attention/
test_cpu_attn_vs_reference.py``), random (never all-zero) keys and values:
* decode: B requests, each with one new query token and a context of C tokens (C over ``context_lens``);
* prefill: one causal sequence of L new tokens (L over ``prefill_lens``).

One call is ``Impl.forward`` (K/V write included, metadata built once beforehand); the time is the median
of ``repeats`` calls after ``warmup`` calls (CUDA events on GPU, perf_counter on CPU). Derived figures:
* decode KV TB/s = bytes of K and V read (B x C x Hkv x D x 2 x element size) / time
* prefill TFLOP/s = 4 x L^2 x Hq x D / 2 (causal: half the score matrix) / time
* decode TFLOP/s = 4 x B x C x Hq x D / time (for completeness)
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from attnserve.attention.backend import AttentionLayerSpec, CommonAttentionMetadata, KVCacheLayout
from attnserve.attention.kv_cache_dtype import kv_cache_torch_dtype
from attnserve.benchmarks.attention_table import format_table
from attnserve.refusals import Refused
from attnserve.refusals.bench import options_unused, simulated_device


@dataclass(frozen=True)
class AttentionBenchShape:
    """The layer being timed."""

    num_heads: int  # query heads
    num_kv_heads: int
    head_size: int
    block_size: int
    dtype: torch.dtype
    kv_cache_dtype: str = "auto"  # the engine's --kv-cache-dtype: auto (= dtype), fp8, fp8_e4m3, fp8_e5m2

    def spec(self) -> AttentionLayerSpec:
        return AttentionLayerSpec(
            num_heads=self.num_heads,
            head_size=self.head_size,
            scale=self.head_size**-0.5,
            num_kv_heads=self.num_kv_heads,
            kv_cache_dtype=self.kv_cache_dtype,
        )

    @property
    def kv_dtype(self) -> torch.dtype:
        return kv_cache_torch_dtype(self.kv_cache_dtype, self.dtype)

    def to_dict(self) -> dict:
        return {**asdict(self), "dtype": str(self.dtype).removeprefix("torch.")}


@dataclass(frozen=True)
class AttentionRow:
    """One backend on one shape. Figures are None unless status is "ok"."""

    backend: str
    phase: str  # "decode" or "prefill"
    batch_size: int  # decode: B; prefill: 1
    context_len: int  # decode: C cached tokens per request (new one included); prefill: L
    status: str  # "ok", "not implemented", "error: ..."
    time_us: float | None = None
    kv_TBps: float | None = None  # decode: K+V bytes read / time
    tflops: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def usable_backends(
    shape: AttentionBenchShape, platform, names: list[str] | None = None, attention_config=None
) -> dict[str, list[str]]:
    """Reasons per backend (empty = usable): the platform's priority list, or ``names`` (where "auto" stands
    for the priority list, as it does for --attention-backend); ``attention_config`` refuses what the engine's
    selector refuses with it (e.g. ``use_prefill_decode_attention`` on CPU_ATTN). Raises ValueError for an
    unknown name."""
    from attnserve.attention.registry import lookup_backend
    from attnserve.attention.selector import AttentionSelectorConfig, evaluate_backends

    members = None
    if names:
        members = []
        for n in names:
            m = lookup_backend(n)
            members += platform.backend_priorities() if m is None else [m]
        members = list(dict.fromkeys(members))
    config = AttentionSelectorConfig(
        head_size=shape.head_size, dtype=shape.dtype, block_size=shape.block_size, kv_cache_dtype=shape.kv_cache_dtype
    )
    return evaluate_backends(config, platform, attention_config, backends=members)


def make_step(
    query_lens: list[int], seq_lens: list[int], block_size: int, gen: torch.Generator, device: torch.device
) -> tuple[CommonAttentionMetadata, int]:
    """Common metadata of one step with block tables in random order; returns it and the number of blocks."""
    num_blocks = sum(-(-s // block_size) for s in seq_lens) + 1
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, slots = [], []
    for q_len, s_len in zip(query_lens, seq_lens):
        table = [perm.pop() for _ in range(-(-s_len // block_size))]
        tables.append(table)
        slots += [table[p // block_size] * block_size + p % block_size for p in range(s_len - q_len, s_len)]
    width = max(len(t) for t in tables)
    block_table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    qsl = torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    decodes = sum(1 for q in query_lens if q == 1)
    common = CommonAttentionMetadata(
        query_start_loc=qsl.to(device),
        query_start_loc_cpu=qsl,
        seq_lens=seq.to(device),
        seq_lens_cpu=seq,
        block_table=block_table.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        num_reqs=len(seq_lens),
        num_actual_tokens=sum(query_lens),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        num_decodes=decodes,
        num_decode_tokens=decodes,
        block_size=block_size,
    )
    return common, num_blocks


def median_time(fn, device: torch.device, warmup: int, repeats: int) -> float:
    """Seconds of one ``fn()`` after ``warmup`` calls.

    On a GPU ``fn`` is captured once in a CUDA graph and replayed ``repeats`` times back to back between two
    CUDA events, so the host's launch overhead (Python, the library's argument handling) stays out of the
    kernel time; the figure is the median over 5 such runs of the mean per replay. A backend whose call
    cannot be captured is timed the same way with plain calls. On CPU: the median of ``repeats`` calls.
    """
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        times.sort()
        return times[len(times) // 2]
    torch.cuda.synchronize(device)
    run = fn
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    except Exception:  # noqa: BLE001 - not capturable: time plain calls
        torch.cuda.synchronize(device)
    run()
    runs = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            run()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) / 1e3 / repeats)
    runs.sort()
    return runs[len(runs) // 2]


def time_case(
    backend_cls,
    shape: AttentionBenchShape,
    platform,
    device: torch.device,
    query_lens: list[int],
    seq_lens: list[int],
    warmup: int,
    repeats: int,
    seed: int = 0,
    attention_config=None,
) -> float:
    """Median seconds of the backend's Impl.forward on one step (raises what the backend raises);
    ``attention_config`` (an ``AttentionConfig``, None = defaults) reaches its builder and Impl as the engine's."""
    from attnserve.model_executor.kv_cache import allocate_kv_caches

    gen = torch.Generator().manual_seed(seed)
    common, num_blocks = make_step(query_lens, seq_lens, shape.block_size, gen, device)
    spec = shape.spec()
    builder = backend_cls.get_builder_cls()(spec, device, shape.dtype, attention_config)
    impl = backend_cls.get_impl_cls()(spec, attention_config)
    layout = backend_cls.get_required_kv_cache_layout(platform) or KVCacheLayout.NHD
    (kv_cache,) = allocate_kv_caches(
        backend_cls,
        layout,
        1,
        num_blocks,
        shape.block_size,
        shape.num_kv_heads,
        shape.head_size,
        shape.kv_dtype,
        device,
    )
    if kv_cache.dtype == shape.dtype:
        kv_cache.normal_(generator=torch.Generator(device=device).manual_seed(seed))
    else:  # fp8: no normal_ for it; N(0, 1) stored (scales 1.0)
        kv_cache.copy_(
            torch.randn(kv_cache.shape, generator=torch.Generator(device=device).manual_seed(seed), device=device).to(
                kv_cache.dtype
            )
        )
    t = sum(query_lens)
    dgen = torch.Generator(device=device).manual_seed(seed + 1)
    q, k, v = (
        torch.randn(t, h, shape.head_size, generator=dgen, device=device, dtype=shape.dtype)
        for h in (shape.num_heads, shape.num_kv_heads, shape.num_kv_heads)
    )
    metadata = builder.build(common)
    with torch.inference_mode():
        return median_time(lambda: impl.forward(q, k, v, kv_cache, metadata), device, warmup, repeats)


def _status(e: Exception) -> str:
    if isinstance(e, NotImplementedError):
        return "not implemented"
    return f"error: {type(e).__name__}: {' '.join(str(e).split())[:200]}"


def bench_backend(
    name: str,
    backend_cls,
    shape: AttentionBenchShape,
    platform,
    device: torch.device,
    batch_size: int,
    context_lens: list[int],
    prefill_lens: list[int],
    warmup: int,
    repeats: int,
    bar=None,
    attention_config=None,
) -> list[AttentionRow]:
    """Rows for every decode and prefill shape of one backend; a failure becomes the row's status (and a
    NotImplementedError marks every remaining shape of the backend too, without running them)."""
    elem = torch.empty((), dtype=shape.kv_dtype).element_size()  # of the KV cache: 1 for fp8
    hq, hkv, d = shape.num_heads, shape.num_kv_heads, shape.head_size
    cases = [("decode", batch_size, c) for c in context_lens] + [("prefill", 1, n) for n in prefill_lens]
    rows: list[AttentionRow] = []
    not_implemented = False
    for phase, b, n in cases:
        if bar is not None:
            bar.set_postfix_str(f"{name} {phase} {b}x{n}")
        if not_implemented:
            rows.append(AttentionRow(name, phase, b, n, "not implemented"))
        else:
            query_lens, seq_lens = ([1] * b, [n] * b) if phase == "decode" else ([n], [n])
            try:
                s = time_case(
                    backend_cls,
                    shape,
                    platform,
                    device,
                    query_lens,
                    seq_lens,
                    warmup,
                    repeats,
                    attention_config=attention_config,
                )
            except Exception as e:  # noqa: BLE001 - one backend's failure is a row, not the end of the run
                not_implemented = isinstance(e, NotImplementedError)
                rows.append(AttentionRow(name, phase, b, n, _status(e)))
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            else:
                if phase == "decode":
                    kv_bytes = 2 * b * n * hkv * d * elem
                    rows.append(
                        AttentionRow(
                            name, phase, b, n, "ok", s * 1e6, kv_bytes / s / 1e12, 4 * b * n * hq * d / s / 1e12
                        )
                    )
                else:
                    rows.append(AttentionRow(name, phase, b, n, "ok", s * 1e6, None, 4 * n * n * hq * d / 2 / s / 1e12))
        if bar is not None:
            bar.update(1)
    return rows


GPU_DEFAULTS = {
    "batch_size": 64,
    "context_lens": [512, 1024, 2048, 4096, 8192],
    "prefill_lens": [512, 1024, 2048, 4096, 8192],
}
CPU_DEFAULTS = {"batch_size": 8, "context_lens": [128, 256, 512, 1024], "prefill_lens": [128, 256, 512, 1024]}


def run_attention(
    *,
    device: str = "auto",
    dtype: str = "auto",
    num_heads: int = 32,
    num_kv_heads: int = 8,
    head_size: int = 128,
    block_size: int = 16,
    kv_cache_dtype: str = "auto",
    batch_size: int | None = None,
    context_lens: list[int] | None = None,
    prefill_lens: list[int] | None = None,
    backends: list[str] | None = None,
    warmup: int = 3,
    repeats: int = 10,
    progress: bool = True,
    attention_config=None,
) -> dict:
    """Time every usable backend; the JSON-ready result. ``None`` sizes take the device's defaults
    (GPU_DEFAULTS / CPU_DEFAULTS); dtype ``auto`` is bfloat16 on GPU, float32 on CPU.
    Raises ValueError for a bad device or an unknown backend name; Refused (path ``attention_config``) for
    ``attention_config`` fields none of the usable backends reads."""
    from tqdm import tqdm

    from attnserve.attention.registry import get_backend_class, lookup_backend
    from attnserve.platforms import detect_platform

    platform = detect_platform(device)
    if platform.simulated:
        raise Refused(simulated_device(device))
    dev = (
        torch.device("cpu")
        if platform.device_type == "cpu"
        else torch.device(device if device.startswith("cuda:") else "cuda")
    )
    defaults = GPU_DEFAULTS if dev.type == "cuda" else CPU_DEFAULTS
    batch_size = batch_size or defaults["batch_size"]
    context_lens = defaults["context_lens"] if context_lens is None else context_lens  # []: no decode case
    prefill_lens = defaults["prefill_lens"] if prefill_lens is None else prefill_lens
    torch_dtype = (
        (torch.bfloat16 if dev.type == "cuda" else torch.float32) if dtype == "auto" else getattr(torch, dtype)
    )
    shape = AttentionBenchShape(num_heads, num_kv_heads, head_size, block_size, torch_dtype, kv_cache_dtype)
    reasons = usable_backends(shape, platform, backends, attention_config)
    usable = [n for n, r in reasons.items() if not r]
    if attention_config is not None and usable:  # an option no timed backend reads would be ignored: refused
        unused = set.intersection(*(set(attention_config.unused_options(lookup_backend(n))) for n in usable))
        if unused:
            raise Refused(options_unused(sorted(unused), usable))
    rows: list[AttentionRow] = []
    with tqdm(
        total=len(usable) * (len(context_lens) + len(prefill_lens)),
        desc="attention",
        unit="case",
        disable=not (progress and usable),
    ) as bar:
        for name in usable:
            cls = get_backend_class(lookup_backend(name))
            rows += bench_backend(
                name,
                cls,
                shape,
                platform,
                dev,
                batch_size,
                context_lens,
                prefill_lens,
                warmup,
                repeats,
                bar,
                attention_config,
            )
    skipped = {n: r for n, r in reasons.items() if r}
    table = format_table(rows)
    if skipped:  # the reasons in the printed table too, not only in the JSON
        table += "\n" + "\n".join(f"skipped {n}: {'; '.join(r)}" for n, r in skipped.items())
    return {
        "kind": "attention",
        "device": platform.description,
        "torch": torch.__version__,
        "shape": shape.to_dict(),
        "batch_size": batch_size,
        "context_lens": context_lens,
        "prefill_lens": prefill_lens,
        "warmup": warmup,
        "repeats": repeats,
        "backends": usable,
        "attention_config": None if attention_config is None else attention_config.to_dict(),
        "skipped": skipped,
        "results": [r.to_dict() for r in rows],
        "table": table,
    }

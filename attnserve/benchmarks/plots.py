"""``--plot out.png``: one picture per benchmark kind (matplotlib, imported only when a plot is asked for).

* throughput: output tokens generated over time, one line per implementation (its slope is tokens/s);
* latency: output tokens/s over batch size, per implementation, with the roofline's tokens/s;
* attention: per backend, kernel time over context length (decode) and over sequence length (prefill).
"""

from __future__ import annotations


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot_throughput(result: dict, path: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in result["results"]:
        ts = [0.0] + [t for t, _ in row["timeline"]]
        ns = [0] + [n for _, n in row["timeline"]]
        ax.plot(ts, ns, label=f"{row['name']}: {row['output_tokens_per_s']:.1f} tok/s")
    w = result["workload"]
    ax.set(
        xlabel="seconds",
        ylabel="output tokens generated",
        title=f"bench throughput: {w['num_prompts']} requests, in {w['input_len']} / out {w['output_len']}"
        f" (range ratio {w['range_ratio']})",
    )
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_latency(result: dict, path: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = sorted({r["name"] for r in result["results"]}, key=lambda n: n != "attnserve")
    for name in names:
        rows = sorted((r for r in result["results"] if r["name"] == name), key=lambda r: r["batch_size"])
        ax.plot([r["batch_size"] for r in rows], [r["output_tokens_per_s"] for r in rows], "o-", label=name)
    ours = sorted((r for r in result["results"] if r["name"] == "attnserve"), key=lambda r: r["batch_size"])
    ax.plot(
        [r["batch_size"] for r in ours],
        [r["batch_size"] / r["roofline"]["limit_s"] for r in ours],
        "kx--",
        label="roofline (bytes / copy bandwidth)",
    )
    w = result["workload"]
    ax.set(
        yscale="log",
        xlabel="batch size",
        ylabel="output tokens/s",
        title=f"bench latency: in {w['input_len']} / out {w['output_len']}",
    )
    ax.set_xscale("log", base=2)
    sizes = sorted({r["batch_size"] for r in result["results"]})
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.minorticks_off()
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_attention(result: dict, path: str) -> None:
    plt = _pyplot()
    fig, (dec, pre) = plt.subplots(1, 2, figsize=(11, 4.5))
    ok = [r for r in result["results"] if r["status"] == "ok"]
    for backend in dict.fromkeys(r["backend"] for r in ok):
        for ax, phase in ((dec, "decode"), (pre, "prefill")):
            rows = [r for r in ok if r["backend"] == backend and r["phase"] == phase]
            if rows:
                ax.plot([r["context_len"] for r in rows], [r["time_us"] for r in rows], "o-", label=backend)
    s = result["shape"]
    heads = f"{s['num_heads']}q/{s['num_kv_heads']}kv heads x {s['head_size']}, {s['dtype']}"
    dec.set(
        xlabel="context length (tokens)", ylabel="microseconds", title=f"decode, batch {result['batch_size']} ({heads})"
    )
    pre.set(xlabel="sequence length (tokens)", ylabel="microseconds", title="causal prefill, one sequence")
    for ax in (dec, pre):
        ax.set(xscale="log", yscale="log")
        ax.grid(alpha=0.3, which="both")
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

"""Latency and throughput vs concurrency, champion beside challenger, as a PNG."""

from __future__ import annotations

from pathlib import Path

from mlrelease.serving.perf import Level


def plot_levels(series: dict[str, list[Level]], out: Path) -> Path:
    """Two panels (p99 latency in ms, throughput in infer/s) with one line per labelled run.

    Concurrency is on a log scale (the sweep is 1, 4, 16, ...); a level of batched requests is labelled
    `c16x16` (16 requests in flight, 16 rows each), so the peak's batches are not mistaken for single rows.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat, tput) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for label, levels in series.items():
        conc = [level.concurrency for level in levels]
        lat.plot(conc, [level.p99_us / 1000 for level in levels], marker="o", label=f"{label} p99")
        lat.plot(conc, [level.p50_us / 1000 for level in levels], marker=".", linestyle="--", label=f"{label} p50")
        tput.plot(conc, [level.throughput for level in levels], marker="o", label=label)
    lat.set(xlabel="concurrency", ylabel="latency (ms)", title="latency vs concurrency")
    tput.set(xlabel="concurrency", ylabel="inferences (rows) / s", title="throughput vs concurrency")
    ticks = {level.concurrency: level.name.removeprefix("c") for levels in series.values() for level in levels}
    for ax in (lat, tput):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(ticks), [ticks[c] for c in sorted(ticks)])
        ax.grid(alpha=0.3)
        ax.legend()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out

"""The report's PNGs, drawn with matplotlib's object API (no pyplot state, no display: Agg canvas)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from mlrelease.report.model import ReleaseReport

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PASS, FAIL, CANDIDATE, CHAMPION = "#2e7d32", "#c62828", "#1f77b4", "#ff7f0e"
MARKER_COLOURS = {
    "rolling_back": "#ef6c00",
    "rolled_back": FAIL,
    "cohort_rolled_back": "#ef6c00",
    "promoted": PASS,
    "paused": "#6a1b9a",
    "approval": "#283593",
}
HOURS_METRICS = {"mae", "p90_abs_error"}  # holdout errors are in hours (the model predicts an ETA in hours)


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _legend_outside(ax: Axes, title: str | None = None) -> None:
    """The legend right of the plot, where it cannot hide a bar or a threshold."""
    ax.legend(title=title, loc="center left", bbox_to_anchor=(1.0, 0.5))


def _line_widths(n: int) -> list[float]:
    """Decreasing widths, so a later line drawn over an earlier one leaves its edges visible."""
    return [1.5 + 2.0 * (n - 1 - i) for i in range(n)]


def _save(fig: Figure, out: Path) -> str:
    fig.savefig(out, dpi=100)
    return out.name


def drift_plot(report: ReleaseReport, out: Path) -> str | None:
    """PSI per key feature (one bar each, red when over its threshold) with the thresholds marked."""
    rows = report.data_quality.drift
    if not rows:
        return None
    fig = _figure(8, 0.45 * len(rows) + 1.6)
    ax = fig.add_subplot()
    labels = [f"{r.table}.{r.column}" for r in rows]
    bars = ax.barh(labels, [r.psi for r in rows], color=[PASS if r.ok else FAIL for r in rows], label="PSI")
    ax.bar_label(bars, fmt="%.3f", padding=3, fontsize=8)
    ax.scatter([r.threshold for r in rows], labels, marker="|", s=300, color="black", label="threshold", zorder=3)
    ax.invert_yaxis()
    ax.set(xlabel="population stability index (PSI, unitless)", title="Drift vs reference window")
    _legend_outside(ax)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, out)


def freshness_plot(report: ReleaseReport, out: Path) -> str | None:
    """Lag of each feature view's newest event against its budget, in hours."""
    rows = report.data_quality.freshness
    if not rows:
        return None
    fig = _figure(8, 0.5 * len(rows) + 1.6)
    ax = fig.add_subplot()
    views = [r.view for r in rows]
    bars = ax.barh(views, [r.lag_s / 3600 for r in rows], color=[PASS if r.fresh else FAIL for r in rows], label="lag")
    ax.bar_label(bars, fmt="%.1f h", padding=3, fontsize=8)
    ax.scatter([r.budget_s / 3600 for r in rows], views, marker="|", s=300, color="black", label="budget", zorder=3)
    ax.invert_yaxis()
    ax.set(xlabel="hours since the newest materialized event", title="Feature freshness: lag vs budget")
    _legend_outside(ax)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, out)


def metrics_plot(report: ReleaseReport, out: Path) -> str | None:
    """One small panel per holdout metric: candidate beside champion."""
    section = report.model_metrics
    if not section.rows:
        return None
    cols = min(3, len(section.rows))
    rows_n = -(-len(section.rows) // cols)
    fig = _figure(3.4 * cols, 2.8 * rows_n + 0.4)
    fig.suptitle(f"Holdout metrics: candidate v{section.candidate_version} vs champion v{section.champion_version}")
    for i, row in enumerate(section.rows):
        ax: Axes = fig.add_subplot(rows_n, cols, i + 1)
        names = [f"candidate v{section.candidate_version}"]
        values = [row.candidate]
        if row.champion is not None:
            names.append(f"champion v{section.champion_version}")
            values.append(row.champion)
        bars = ax.bar(names, values, color=[CANDIDATE, CHAMPION][: len(values)])
        ax.bar_label(bars, fmt="%.4g", fontsize=8)
        ax.margins(y=0.2)
        direction = {True: "lower is better", False: "higher is better", None: ""}[row.lower_is_better]
        ax.set_title(f"{row.name}\n({direction})" if direction else row.name, fontsize=9)
        ax.set_ylabel("hours" if row.name in HOURS_METRICS else "value")
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(axis="y", alpha=0.3)
    return _save(fig, out)


def benchmark_plot(report: ReleaseReport, out: Path) -> str | None:
    """Latency and throughput vs concurrency: the benchmark step's own plot (serving.perf_plot)."""
    from mlrelease.serving.perf_plot import plot_levels

    if not report.benchmark.series:
        return None
    return plot_levels({name: list(levels) for name, levels in report.benchmark.series.items()}, out).name


def shadow_plot(report: ReleaseReport, out: Path) -> str | None:
    """Share of replayed orders whose ETA differs beyond tolerance, per cohort, with the gate's limit."""
    section = report.shadow
    if not section.by_cohort:
        return None
    fig = _figure(7, 3.2)
    ax = fig.add_subplot()
    cohorts = list(section.by_cohort)
    limit = section.max_disagreement_share
    shares = [100 * section.by_cohort[c] for c in cohorts]
    ok = [limit is None or v <= 100 * limit for v in shares]
    bars = ax.bar(cohorts, shares, color=[PASS if good else FAIL for good in ok], label="differing rows")
    ax.bar_label(bars, fmt="%.1f %%", fontsize=8)
    if limit is not None:
        ax.axhline(100 * limit, color="black", linestyle="--", label=f"limit {limit:.0%}")
    ax.set_ylim(0, max([*shares, 100 * (limit or 0), 1.0]) * 1.25)
    ax.set(xlabel="cohort", ylabel="% of replayed orders", title="Shadow: candidate vs stable disagreement per cohort")
    _legend_outside(ax)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, out)


def rollout_plot(report: ReleaseReport, out: Path) -> str | None:
    """Planned candidate share per cohort over time with rollback/promotion markers; served share below."""
    import matplotlib.dates as mdates

    section = report.rollout
    if not section.shares:
        return None
    panels = 2 if section.served else 1
    fig = _figure(10, 3.6 * panels)
    axes = [fig.add_subplot(panels, 1, i + 1) for i in range(panels)]
    times = mdates.date2num([p.at for p in section.shares])
    # Cohorts often share a value (two at 100 %): thinner lines on top of thicker ones keep each visible.
    widths = _line_widths(len(section.cohorts))
    # One colour per cohort in both panels (the served panel may lack a cohort or have an extra one).
    names = [*section.cohorts, *(c for c in section.served if c not in section.cohorts)]
    colours = {cohort: f"C{i % 10}" for i, cohort in enumerate(names)}
    for cohort, width in zip(section.cohorts, widths, strict=True):
        shares = [p.shares[cohort] for p in section.shares]
        axes[0].step(times, shares, where="post", linewidth=width, color=colours[cohort], label=cohort)
    served_widths = dict(zip(section.cohorts, widths, strict=True))
    axes[0].set(title=f"Rollout of v{section.candidate_version}: planned candidate share per cohort")
    if section.served:
        for cohort, points in section.served.items():
            width = 0.6 * served_widths.get(cohort, 1.5)
            axes[1].plot(
                mdates.date2num([p.at for p in points]),
                [p.share for p in points],
                marker=".",
                linewidth=width,
                color=colours[cohort],
                label=cohort,
            )
        axes[1].set(title="Served by the candidate (gateway decision log)")
    for ax in axes:
        for marker in section.markers:
            colour = MARKER_COLOURS.get(marker.kind, "grey")
            strong = marker.kind != "stage_opened"
            ax.axvline(
                float(mdates.date2num(marker.at)),
                color=colour,
                linestyle="-" if strong else ":",
                linewidth=2 if strong else 1,
            )
            ax.annotate(
                marker.label,
                (mdates.date2num(marker.at), 0.5),
                xycoords=("data", "axes fraction"),
                xytext=(-4, 0),
                textcoords="offset points",
                rotation=90,
                va="center",
                ha="right",
                fontsize=8,
                color=colour,
                bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none", "pad": 1},
            )
        ax.set(ylabel="% of cohort traffic", ylim=(-5, 110), xlabel="time (UTC)")
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
        ax.grid(alpha=0.3)
        _legend_outside(ax, title="cohort")
    return _save(fig, out)


RELATIVE_METRICS = ("latency", "prediction_shift", "confidence_shift")


def evidence_plot(report: ReleaseReport, out: Path) -> str | None:
    """Per stage and contract: each cohort's estimate and confidence band over time, the tolerance, the decision."""
    points = report.rollout.evidence
    if not points:
        return None
    stages = sorted({p.stage for p in points})
    contracts = {s: sorted({p.contract for p in points if p.stage == s}) for s in stages}
    cols = max(len(c) for c in contracts.values())
    fig = _figure(3.2 * cols, 2.6 * len(stages))
    names = report.rollout.stages
    for row, stage in enumerate(stages):
        decided = max(p.elapsed_s for p in points if p.stage == stage)
        for col, contract in enumerate(contracts[stage]):
            ax: Axes = fig.add_subplot(len(stages), cols, row * cols + col + 1)
            mine = [p for p in points if p.stage == stage and p.contract == contract]
            relative = mine[0].metric in RELATIVE_METRICS
            scale = (lambda x: 100 * math.expm1(x)) if relative else (lambda x: 100 * x)  # % or pp
            for i, cohort in enumerate(sorted({p.cohort for p in mine})):
                series = sorted((p for p in mine if p.cohort == cohort), key=lambda p: p.elapsed_s)
                t = [p.elapsed_s for p in series]
                ax.plot(t, [scale(p.estimate) for p in series], color=f"C{i}", label=cohort, linewidth=1.2)
                ax.fill_between(
                    t, [scale(p.lower) for p in series], [scale(p.upper) for p in series], color=f"C{i}", alpha=0.2
                )
            tolerance = scale(mine[0].tolerance)
            ax.axhline(tolerance, color=FAIL, linestyle="--", linewidth=1)
            if "±" in contract:
                ax.axhline(-tolerance, color=FAIL, linestyle="--", linewidth=1)
            ax.axvline(decided, color="black", linewidth=1)
            title = names[stage - 1].name if 1 <= stage <= len(names) else f"stage {stage}"
            ax.set_title(f"{title}: {contract}", fontsize=7)
            ax.set_xlabel("s since the stage opened", fontsize=7)
            ax.set_ylabel("% shift" if relative else "pp vs reference", fontsize=7)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            if col == 0:
                ax.legend(fontsize=6, loc="best")
    return _save(fig, out)


PLOTS = {
    "data_quality_drift.png": drift_plot,
    "data_quality_freshness.png": freshness_plot,
    "model_metrics.png": metrics_plot,
    "benchmark.png": benchmark_plot,
    "shadow.png": shadow_plot,
    "rollout.png": rollout_plot,
    "evidence.png": evidence_plot,
}


def draw_all(report: ReleaseReport, folder: Path) -> dict[str, str]:
    """Every plot the report has data for, written into `folder`; returns {plot id: file name}."""
    drawn = {}
    for name, draw in PLOTS.items():
        file = draw(report, folder / name)
        if file is not None:
            drawn[name.removesuffix(".png")] = file
    return drawn

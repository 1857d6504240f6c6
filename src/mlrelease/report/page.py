"""Render a `ReleaseReport` to `index.html` (Jinja2, autoescaped) beside its PNGs, in one folder."""

from __future__ import annotations

import math
from pathlib import Path

from mlrelease.report.links import REPORT_PAGE
from mlrelease.report.model import ReleaseReport
from mlrelease.report.plots import draw_all
from mlrelease.report.template import TEMPLATE

DASH = "-"


def num(value: float | int | None, digits: int | None = None) -> str:
    """A number for a table cell: fixed digits when given, else 4 significant; a dash when unknown."""
    if value is None:
        return DASH
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:.{digits}f}" if digits is not None else f"{value:.4g}"


def pct(share: float | None) -> str:
    """A 0..1 share as a percentage."""
    return DASH if share is None else f"{100 * share:.1f} %"


def hours(seconds: float) -> str:
    """Seconds as hours with one decimal (freshness lags and budgets)."""
    return f"{seconds / 3600:.1f} h"


def version(value: int | None) -> str:
    """`v3`, or `none` before the first champion."""
    return DASH if value is None else f"v{value}"


def change(candidate: float, champion: float | None) -> str:
    """Relative change of the candidate against the champion."""
    if champion is None or champion == 0:
        return DASH
    return f"{(candidate - champion) / abs(champion):+.1%}"


def render(report: ReleaseReport, plots: dict[str, str]) -> str:
    """The page's HTML; every value is escaped (run data may hold anything, e.g. an error message with <tags>)."""
    from jinja2 import Environment, StrictUndefined

    env = Environment(autoescape=True, undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(TEMPLATE)
    return template.render(r=report, plots=plots, num=num, pct=pct, hours=hours, version=version, change=change)


def write_page(report: ReleaseReport, folder: Path) -> list[str]:
    """Draw the PNGs and write index.html into `folder` (which must exist); returns the file names written."""
    plots = draw_all(report, folder)
    (folder / REPORT_PAGE).write_text(render(report, plots), encoding="utf-8")
    return [REPORT_PAGE, *plots.values()]

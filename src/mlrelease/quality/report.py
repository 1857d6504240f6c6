"""A self-contained HTML report of one validate-data run (GX results plus drift), readable without Data Docs."""

from __future__ import annotations

import html
from typing import Any

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2rem;color:#222}table{border-collapse:collapse;margin:0 0 2rem}
td,th{border:1px solid #ccc;padding:.3rem .6rem;text-align:left;font-size:.9rem}
.pass{color:#176b2c}.fail{color:#b00020;font-weight:600}h2{margin-top:2rem}
"""


def _row(cells: list[str], ok: bool | None = None) -> str:
    cls = "" if ok is None else f' class="{"pass" if ok else "fail"}"'
    return "<tr>" + "".join(f"<td{cls if i == 0 else ''}>{c}</td>" for i, c in enumerate(cells)) + "</tr>"


def render_report(summary: dict[str, Any]) -> str:
    """HTML for the summary that validate-data returns (tables → expectations, drift → PSI per column)."""
    esc = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>mlrelease data quality</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>Data quality: {'PASSED' if summary['success'] else 'FAILED'}</h1>",
        f"<p>Window {esc(summary['window']['start'])} → {esc(summary['window']['end'])}; "
        f"reference {esc(str(summary.get('reference')))}</p>",
    ]
    for name, table in summary["tables"].items():
        parts.append(f"<h2>{esc(name)} — {table['rows']} rows</h2><table>")
        parts.append("<tr><th>result</th><th>expectation</th><th>column</th><th>observed</th></tr>")
        for exp in table["expectations"]:
            parts.append(
                _row(
                    [
                        "pass" if exp["success"] else "FAIL",
                        esc(exp["type"]),
                        esc(str(exp.get("column") or "")),
                        esc(str(exp.get("observed", ""))),
                    ],
                    exp["success"],
                )
            )
        parts.append("</table>")
        if table["drift"]:
            parts.append("<table><tr><th>result</th><th>drift (PSI)</th><th>value</th><th>threshold</th></tr>")
            for col, d in table["drift"].items():
                parts.append(
                    _row(["pass" if d["ok"] else "FAIL", esc(col), f"{d['psi']:.4f}", f"{d['threshold']:g}"], d["ok"])
                )
            parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)

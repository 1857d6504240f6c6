"""The Jinja2 template of the report page: one self-contained HTML file (inline CSS, no scripts, no CDN).

Kept as a module constant rather than a package data file, so every install of the package has it.
"""

# ruff: noqa: E501 - HTML lines are as long as their markup; wrapping them would change the rendered text.

TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{{ r.model }} release {{ r.key }}: {{ r.verdict.headline }}</title>
<style>
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1100px;padding:1.5rem;color:#1b1b1b}
h1{font-size:1.5rem;margin:.2rem 0}h2{margin-top:2.2rem;border-bottom:1px solid #ddd;padding-bottom:.3rem}
h3{margin:1.4rem 0 .5rem;font-size:1.05rem}
table{border-collapse:collapse;margin:.6rem 0 1rem;font-size:.88rem}
td,th{border:1px solid #d0d0d0;padding:.25rem .55rem;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.meta td:first-child{font-weight:600;background:#fafafa}
.verdict{padding:.8rem 1rem;border-radius:6px;margin:1rem 0;border-left:6px solid}
.verdict .headline{font-size:1.3rem;font-weight:700}
.good{background:#e8f5e9;border-color:#2e7d32}.bad{background:#ffebee;border-color:#c62828}
.warn{background:#fff8e1;border-color:#f9a825}
.badge{display:inline-block;font-size:.75rem;padding:.05rem .45rem;border-radius:3px;margin-left:.5rem;
vertical-align:middle;color:#fff}
.state-ok{background:#2e7d32}.state-failed{background:#c62828}.state-skipped{background:#757575}
.state-not-reached{background:#9e9e9e}
.pass,.success{color:#1b5e20}.fail,.failed{color:#b71c1c;font-weight:600}.inconclusive,.skipped{color:#8d6e00}
.note{color:#444;margin:.3rem 0 .8rem}.muted{color:#777}
img{max-width:100%;height:auto;border:1px solid #eee;margin:.4rem 0}
code{font-size:.85rem;background:#f4f4f4;padding:0 .2rem}
</style>
</head>
<body>
<header>
<div class="muted">mlrelease release report</div>
<h1>{{ r.model }} &mdash; run {{ r.key }}</h1>
<div class="verdict {{ r.verdict.tone }}" id="verdict">
<div class="headline">{{ r.verdict.headline }}</div>
{% if r.verdict.detail %}<div>{{ r.verdict.detail }}</div>{% endif %}
</div>
<table class="meta">
<tr><td>model</td><td>{{ r.model }}</td></tr>
<tr><td>candidate version</td><td>{{ version(r.candidate_version) }}</td></tr>
<tr><td>champion version (before this run)</td><td>{{ version(r.champion_version) }}</td></tr>
<tr><td>data interval end</td><td>{{ r.data_interval_end.isoformat() }}</td></tr>
<tr><td>run key</td><td><code>{{ r.key }}</code></td></tr>
<tr><td>DAG run</td><td>{{ r.dag_run_id or "unknown" }}</td></tr>
<tr><td>MLflow training run</td><td>
{%- if r.mlflow.ui_url %}<a href="{{ r.mlflow.ui_url }}">{{ r.mlflow.run_id }}</a>
{%- elif r.mlflow.run_id %}<code>{{ r.mlflow.run_id }}</code>{% if r.mlflow.tracking_uri %} in
<code>{{ r.mlflow.tracking_uri }}</code>{% endif %}
{%- else %}<span class="muted">unknown{% if r.mlflow.error %}: {{ r.mlflow.error }}{% endif %}</span>{% endif -%}
</td></tr>
</table>
</header>

<h2 id="steps">Steps</h2>
<table>
<tr><th>task</th><th>outcome</th><th>detail</th></tr>
{% for s in r.steps %}<tr><td>{{ s.task }}</td><td class="{{ s.status | replace(' ', '-') }}">{{ s.status }}</td>
<td>{{ s.detail }}</td></tr>
{% endfor %}</table>

{% macro heading(id, title, section) -%}
<h2>{{ title }}<span class="badge state-{{ section.state.value | replace(' ', '-') }}">{{ section.state.value }}</span></h2>
{% if section.note %}<p class="note">{{ section.note }}</p>{% endif %}
{%- endmacro %}
{% macro plot(name, alt) -%}
{% if name in plots %}<img src="{{ plots[name] }}" alt="{{ alt }}">{% endif %}
{%- endmacro %}

{% set dq = r.data_quality %}
<section id="data_quality">
{{ heading("data_quality", "Data quality", dq) }}
{% if dq.freshness %}
<h3>Freshness</h3>
<table><tr><th>feature view</th><th>lag</th><th>budget</th><th>result</th></tr>
{% for f in dq.freshness %}<tr><td>{{ f.view }}</td><td class="num">{{ hours(f.lag_s) }}</td>
<td class="num">{{ hours(f.budget_s) }}</td><td class="{{ 'pass' if f.fresh else 'fail' }}">
{{ 'fresh' if f.fresh else 'STALE' }}</td></tr>
{% endfor %}</table>
{{ plot("data_quality_freshness", "feature freshness lag vs budget per feature view") }}
{% endif %}
{% if dq.tables %}
<h3>Expectations</h3>
<table><tr><th>table</th><th>rows</th><th>passed</th><th>failed</th><th>failures</th></tr>
{% for t in dq.tables %}<tr><td>{{ t.name }}</td><td class="num">{{ t.rows }}</td><td class="num">{{ t.passed }}</td>
<td class="num {{ 'fail' if t.failed else '' }}">{{ t.failed }}</td><td>{{ t.failures | join("; ") }}</td></tr>
{% endfor %}</table>
{% endif %}
{% if dq.drift %}
<h3>Drift of key features</h3>
<table><tr><th>feature</th><th>PSI</th><th>threshold</th><th>result</th></tr>
{% for d in dq.drift %}<tr><td>{{ d.table }}.{{ d.column }}</td><td class="num">{{ num(d.psi, 4) }}</td>
<td class="num">{{ num(d.threshold) }}</td><td class="{{ 'pass' if d.ok else 'fail' }}">{{ 'pass' if d.ok else 'DRIFT' }}</td></tr>
{% endfor %}</table>
{{ plot("data_quality_drift", "PSI per key feature against its threshold") }}
{% endif %}
{% if dq.failures %}<h3>Failed checks</h3><ul>{% for f in dq.failures %}<li>{{ f }}</li>{% endfor %}</ul>{% endif %}
</section>

{% set mm = r.model_metrics %}
<section id="model_metrics">
{{ heading("model_metrics", "Model metrics vs champion", mm) }}
{% if mm.rows %}
<p>Holdout metrics from the {{ mm.source }}.{% if mm.decision %} Decision: {{ mm.decision }}{% endif %}</p>
<table><tr><th>metric</th><th>candidate {{ version(mm.candidate_version) }}</th>
<th>champion {{ version(mm.champion_version) }}</th><th>change</th><th>better is</th></tr>
{% for m in mm.rows %}<tr><td>{{ m.name }}</td><td class="num">{{ num(m.candidate, 4) }}</td>
<td class="num">{{ num(m.champion, 4) }}</td><td class="num">{{ change(m.candidate, m.champion) }}</td>
<td>{{ {True: "lower", False: "higher", None: "-"}[m.lower_is_better] }}</td></tr>
{% endfor %}</table>
{{ plot("model_metrics", "holdout metrics, candidate beside champion") }}
{% if mm.cohorts %}
<h3>Per cohort</h3>
<table><tr><th>cohort</th><th>metric</th><th>candidate</th><th>champion</th></tr>
{% for c in mm.cohorts %}<tr><td>{{ c.cohort }}</td><td>{{ c.name }}</td><td class="num">{{ num(c.candidate, 4) }}</td>
<td class="num">{{ num(c.champion, 4) }}</td></tr>
{% endfor %}</table>
{% endif %}
{% endif %}
</section>

{% set b = r.benchmark %}
<section id="benchmark">
{{ heading("benchmark", "Benchmark (perf_analyzer)", b) }}
{% if b.series %}
{% if b.verdict %}<p>{{ b.verdict }}</p>{% endif %}
{% if b.p99_ratio is not none %}<p>Worst p99 ratio {{ num(b.p99_ratio, 3) }}, worst throughput ratio
{{ num(b.throughput_ratio, 3) }} (candidate / champion, medians of {{ b.rounds }} rounds).</p>{% endif %}
<table><tr><th>run</th><th>concurrency</th><th>throughput (infer/s)</th><th>p50 (ms)</th><th>p99 (ms)</th></tr>
{% for name, levels in b.series.items() %}{% for lv in levels %}<tr><td>{{ name }}</td><td class="num">{{ lv.concurrency }}</td>
<td class="num">{{ num(lv.throughput, 0) }}</td><td class="num">{{ num(lv.p50_us / 1000, 2) }}</td>
<td class="num">{{ num(lv.p99_us / 1000, 2) }}</td></tr>
{% endfor %}{% endfor %}</table>
{{ plot("benchmark", "latency and throughput vs concurrency, candidate and champion") }}
{% endif %}
</section>

{% set sh = r.shadow %}
<section id="shadow">
{{ heading("shadow", "Shadow evaluation", sh) }}
{% if sh.rows %}
<table>
<tr><th>measure</th><th>value</th><th>limit</th></tr>
<tr><td>replayed orders</td><td class="num">{{ sh.rows }}</td><td></td></tr>
<tr><td>differing rows (all cohorts)</td><td class="num">{{ pct(sh.disagreement_share) }}</td>
<td class="num">{% if sh.max_disagreement_share is not none %}&le; {{ pct(sh.max_disagreement_share) }}{% endif %}</td></tr>
{% for c, v in sh.by_cohort.items() %}<tr><td>differing rows: {{ c }}</td><td class="num">{{ pct(v) }}</td><td></td></tr>
{% endfor %}
<tr><td>latency ratio (candidate / stable, {{ sh.latency_pairs }} interleaved pairs)</td>
<td class="num">{{ num(sh.latency_ratio, 3) }}{% if sh.latency_ratio_band %} (band {{ num(sh.latency_ratio_band[0], 3) }} &hellip; {{ num(sh.latency_ratio_band[1], 3) }}){% endif %}</td>
<td class="num">{% if sh.latency_tolerance is not none %}&le; {{ num(1 + sh.latency_tolerance, 2) }}{% endif %}
<span class="{{ sh.latency_verdict }}">{{ sh.latency_verdict }}</span></td></tr>
{% if sh.tail_quantile is not none %}<tr><td>tail: share slower than{% if sh.latency_tolerance is not none %} {{ num(1 + sh.latency_tolerance, 2) }}&times;{% endif %} stable's p{{ num(sh.tail_quantile * 100, 0) }} (candidate) &minus; beyond its p{{ num(sh.tail_quantile * 100, 0) }} (stable), same pairs</td>
<td class="num">{{ num(sh.tail_share_diff * 100, 2) }} pp{% if sh.tail_band %} (band {{ num(sh.tail_band[0] * 100, 2) }} &hellip; {{ num(sh.tail_band[1] * 100, 2) }}){% endif %}</td>
<td class="num">&le; +{{ num(sh.tail_tolerance * 100, 1) }} pp <span class="{{ sh.tail_verdict }}">{{ sh.tail_verdict }}</span></td></tr>{% endif %}
{% for v, ms in sh.median_latency_ms.items() %}<tr><td>median latency v{{ v }}</td><td class="num">{{ num(ms, 3) }} ms</td><td></td></tr>
{% endfor %}
<tr><td>non-finite predictions</td><td class="num">{{ sh.non_finite }}</td><td class="num">0</td></tr>
</table>
{{ plot("shadow", "share of differing rows per cohort") }}
{% endif %}
</section>

{% set ro = r.rollout %}
<section id="rollout">
{{ heading("rollout", "Rollout timeline", ro) }}
{% if ro.shares %}
<p>v{{ ro.candidate_version }} against stable v{{ ro.stable_version }}: <strong>{{ ro.phase }}</strong>{%
if ro.started_at %}, started {{ ro.started_at.isoformat() }}{% endif %}{%
if ro.finished_at %}, finished {{ ro.finished_at.isoformat() }}{% endif %}.
{% if ro.excluded_cohorts %}Cohorts taken back to stable: <strong class="fail">{{ ro.excluded_cohorts | join(", ") }}</strong>.{% endif %}</p>
{{ plot("rollout", "candidate traffic share per cohort over time, with rollback and promotion markers") }}
{% if not ro.served %}<p class="muted">Served share: {{ ro.served_note }}.</p>{% endif %}
<h3>Events</h3>
<table><tr><th>time (UTC)</th><th>+s</th><th>event</th></tr>
{% for m in ro.markers %}<tr><td>{{ m.at.strftime("%Y-%m-%d %H:%M:%S") }}</td>
<td class="num">{{ num((m.at - ro.started_at).total_seconds(), 1) }}</td>
<td class="{{ 'fail' if 'rolled_back' in m.kind else ('pass' if m.kind == 'promoted' else '') }}">{{ m.label }}</td></tr>
{% endfor %}</table>
{% endif %}
{% if ro.evidence %}
<h3>Evidence</h3>
<p class="note">Each contract's estimate (candidate against its concurrent control) and its anytime-valid
confidence band at every analysis tick; dashed: the tolerance; the vertical line: the decision.</p>
{{ plot("evidence", "estimate and confidence band over time per stage and guardrail, against the tolerance") }}
{% endif %}
{% for st in ro.stages %}
<h3>Stage {{ st.number }} {{ st.name }}: {{ st.action }}</h3>
<p class="note">{{ st.reason }}{% if st.verdicts %} &mdash; {% for c, v in st.verdicts.items() %}{{ c }}
<span class="{{ v }}">{{ v }}</span>{% if not loop.last %}, {% endif %}{% endfor %}{% endif %}</p>
<table><tr><th>cohort</th><th>guardrail</th><th>candidate</th><th>stable</th><th>tolerance</th><th>estimate (band)</th><th>verdict</th></tr>
{% for g in st.guardrails %}<tr><td>{{ g.cohort }}</td><td>{{ g.metric }}</td><td class="num">{{ num(g.candidate, 4) }}</td>
<td class="num">{{ num(g.stable, 4) }}</td><td class="num">{{ num(g.threshold, 4) }}</td>
<td class="num">{% if g.band %}{{ num(g.band.estimate, 4) }} ({{ num(g.band.lower, 4) }} &hellip; {{ num(g.band.upper, 4) }}){% endif %}</td>
<td class="{{ g.verdict }}" title="{{ g.reason }}">{{ g.verdict }}</td></tr>
{% endfor %}</table>
{% endfor %}
</section>
<footer class="muted"><p>Generated by <code>mlrelease</code> from the run's artifacts under
<code>artifacts/{{ r.model }}/{{ r.key }}</code>.</p></footer>
</body>
</html>
"""

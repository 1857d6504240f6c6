"""deploy/monitoring: Prometheus rules and the Grafana dashboard, checked with promtool and against the code.

promtool is required (Debian package `prometheus`): these tests fail, not skip, without it. They check that
the rules load and pass their own promtool unit tests, that every dashboard query parses, that every metric
the rules and the dashboard name is one the gateway, the freshness step or Triton exports, and that the
thresholds mirroring config/rollout_plan.yaml equal the plan's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from mlrelease.freshness import assess
from mlrelease.gateway.config import load_config
from mlrelease.gateway.metrics import GatewayMetrics
from mlrelease.rollout.plan import RolloutPlan, load_plan
from mlrelease.steps.check_freshness import freshness_registry
from mlrelease.yamlconfig import safe_load

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "deploy" / "monitoring"
RULES_DIR = MONITORING / "prometheus"
RULES = RULES_DIR / "alerts.yaml"
RULE_TESTS = (RULES_DIR / "alerts.test.yaml", RULES_DIR / "alerts.daily.test.yaml")
DASHBOARD = MONITORING / "grafana" / "mlrelease-gateway.json"
README = MONITORING / "README.md"
DATASOURCE_REF = {"type": "prometheus", "uid": "${datasource}"}

# Triton's metric names, from its metrics guide:
# https://github.com/triton-inference-server/server/blob/main/docs/user_guide/metrics.md
# (inference request counts, cumulative latency counters in microseconds, GPU metrics per gpu_uuid).
TRITON_METRICS = frozenset(
    {
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
        "nv_gpu_utilization",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_power_usage",
        "nv_gpu_power_limit",
        "nv_energy_consumption",
    }
)
PROMETHEUS_SYNTHETIC = frozenset({"up"})  # written by Prometheus itself for every scrape target
# Grafana's own variables, and a valid value for each when a query is checked outside Grafana.
GRAFANA_BUILTINS = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h"}
VARIABLE_SAMPLES = {"cohort": "long_tail", "version": "2", "model": "parcel_eta"}
# Guardrail metrics no PromQL rule can mirror: the KS test needs both versions' raw predictions.
NOT_IN_PROMQL = {"prediction_shift"}

# PromQL words that are not metric names (everything followed by "(" is a function call already).
PROMQL_WORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool"}
    | {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk"}
    | {"quantile", "limitk", "limit_ratio", "inf", "nan"}
)


# ------------------------------------------------------------------ helpers


@pytest.fixture(scope="module")
def promtool() -> str:
    """The promtool binary; its absence fails the test with what to install."""
    found = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").is_file() else None)
    if found is None:
        pytest.fail("promtool is not installed: `apt-get install prometheus` (Debian ships promtool in it)")
    return found


def _run(promtool: str, *args: str, cwd: Path = RULES_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def _rule_groups() -> list[dict[str, Any]]:
    return safe_load(RULES.read_text(encoding="utf-8"))["groups"]


def _rules() -> list[dict[str, Any]]:
    return [rule for group in _rule_groups() for rule in group["rules"]]


def _alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in _rules() if "alert" in rule}


def _recorded() -> set[str]:
    return {rule["record"] for rule in _rules() if "record" in rule}


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def _dashboard_queries(dashboard: dict[str, Any]) -> dict[str, str]:
    """{where: PromQL} for every panel target, annotation query and label_values() selector."""
    queries = {}
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            queries[f"panel {panel['id']} ({panel['title']}) target {target['refId']}"] = target["expr"]
    for annotation in dashboard["annotations"]["list"]:
        if "expr" in annotation:
            queries[f"annotation {annotation['name']}"] = annotation["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["definition"])
            assert match, f"variable {variable['name']}: expected label_values(selector, label)"
            queries[f"variable {variable['name']}"] = match.group(1)
    return queries


def _substitute(expr: str, variables: dict[str, str]) -> str:
    """Replace $var / ${var} with the sample value Grafana would put there."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise AssertionError(f"undefined dashboard variable ${name} in {expr!r}")
        return variables[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (strings, matchers, ranges and label lists removed)."""
    text = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        word, is_call = match.group(1), match.group(2)
        if not is_call and word.lower() not in PROMQL_WORDS:
            names.add(word)
    return names


def exported_names(registry: CollectorRegistry) -> set[str]:
    """Series names a prometheus_client registry exposes (counters get _total, histograms _bucket/_count/_sum)."""
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum")}
    names = set()
    for family in registry.collect():
        assert family.type in suffixes, f"{family.name}: add the series names of a {family.type}"
        names |= {family.name + suffix for suffix in suffixes[family.type]}
    return names


def _known_metrics() -> set[str]:
    end = datetime(2026, 11, 29, 2, tzinfo=UTC)
    freshness = freshness_registry([assess("v", timedelta(hours=1), end, end)], checked_at=0.0)
    return (
        exported_names(GatewayMetrics().registry)
        | exported_names(freshness)
        | TRITON_METRICS
        | PROMETHEUS_SYNTHETIC
        | _recorded()
    )


def unknown_metrics(exprs: Iterable[str], known: set[str]) -> dict[str, set[str]]:
    """{expr: names it selects that nothing exports}, for the expressions that have any."""
    found = {expr: metric_names(expr) - known for expr in exprs}
    return {expr: names for expr, names in found.items() if names}


def _check_exprs(promtool: str, exprs: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """promtool check rules on the expressions written as recording rules (the way to parse PromQL offline)."""
    rules = [{"record": f"dashboard_check:query_{i}", "expr": expr} for i, expr in enumerate(exprs.values())]
    path = tmp_path / "dashboard_queries.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}), encoding="utf-8")
    return _run(promtool, "check", "rules", str(path), cwd=tmp_path)


def _threshold(expr: str, series: str) -> float:
    """The number in `<series>{…} > N` within an alert expression."""
    match = re.search(re.escape(series) + r"(?:\{[^}]*\})?\s*>\s*([0-9.eE+-]+)", expr)
    assert match, f"no `{series} > N` in {expr!r}"
    return float(match.group(1))


def _plan_max(plan: RolloutPlan, metric: str, cohorts: tuple[str, ...] = ()) -> float:
    """The single bound the plan gives `metric` (for `cohorts`): its limit, else its tolerance against stable."""
    values = {
        g.limit if g.limit is not None else g.tolerance
        for s in plan.stages
        for g in s.guardrails
        if g.metric == metric and g.cohorts == cohorts
    }
    assert len(values) == 1, (
        f"plan gives {metric} (cohorts {cohorts or 'all'}) the maxima {values}: one alert mirrors one"
    )
    return values.pop()


# ------------------------------------------------------------------ the rules


def test_rules_pass_promtool_check(promtool):
    result = _run(promtool, "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in result.stdout


def test_rules_pass_their_promtool_unit_tests(promtool):
    result = _run(promtool, "test", "rules", *(str(p) for p in RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_TESTS)


def test_every_alert_has_a_firing_and_a_quiet_unit_test():
    cases: dict[str, dict[str, int]] = {name: {"firing": 0, "quiet": 0} for name in _alerts()}
    for path in RULE_TESTS:
        for group in safe_load(path.read_text(encoding="utf-8"))["tests"]:
            for case in group.get("alert_rule_test", []):
                assert case["alertname"] in cases, f"{path.name} tests unknown alert {case['alertname']}"
                cases[case["alertname"]]["firing" if case["exp_alerts"] else "quiet"] += 1
    untested = {name: seen for name, seen in cases.items() if not (seen["firing"] and seen["quiet"])}
    assert not untested, f"alerts without both a firing and a quiet case: {untested}"


def test_every_alert_has_severity_summary_description_and_a_runbook_anchor_that_exists():
    anchors = {
        re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-")
        for heading in re.findall(r"^#+\s+(.+?)\s*$", README.read_text(encoding="utf-8"), flags=re.MULTILINE)
    }
    names = [rule["alert"] for rule in _rules() if "alert" in rule]
    assert len(names) == len(set(names)), "alert names must be unique"
    for name, alert in _alerts().items():
        assert alert["labels"]["severity"] in {"critical", "warning"}, name
        for key in ("summary", "description", "runbook_url"):
            assert alert["annotations"].get(key, "").strip(), f"{name} has no {key}"
        url = alert["annotations"]["runbook_url"]
        assert url.startswith("https://github.com/mlrelease/mlrelease/blob/main/deploy/monitoring/README.md#"), url
        assert url.split("#", 1)[1] in anchors, f"{name}: README.md has no heading for {url}"


def test_recording_rules_follow_the_level_metric_operations_convention():
    for record in _recorded():
        assert re.fullmatch(r"mlrelease:[a-z0-9_]+:[a-z0-9_]+|mlrelease:[a-z0-9_]+", record), record


# ------------------------------------------------------------------ metric names


def test_metric_name_extraction_finds_selectors_and_ignores_functions_labels_and_keywords():
    expr = (
        'sum by (version, le) (rate(mlrelease_gateway_model_latency_seconds_bucket{kind=~"a|b"}[5m])) / 1e6'
        " / on () group_left () min(mlrelease:gateway_model_calls:rate5m offset 5m) > bool 0.1"
        " and time() - up unless absent(nv_gpu_utilization)"
    )
    assert metric_names(expr) == {
        "mlrelease_gateway_model_latency_seconds_bucket",
        "mlrelease:gateway_model_calls:rate5m",
        "up",
        "nv_gpu_utilization",
    }


def test_a_misspelt_metric_is_reported():
    known = _known_metrics()
    assert "mlrelease_gateway_requests_total" in known  # the real name is known …
    typo = "sum(rate(mlrelease_gateway_request_total[5m]))"  # … and a near miss is not
    assert unknown_metrics([typo], known) == {typo: {"mlrelease_gateway_request_total"}}
    assert unknown_metrics(["nv_inference_queue_duration_ms"], known)


def test_every_metric_the_rules_use_is_exported():
    known = _known_metrics()
    assert unknown_metrics((rule["expr"] for rule in _rules()), known) == {}


def test_every_metric_the_dashboard_uses_is_exported():
    known = _known_metrics()
    assert unknown_metrics(_dashboard_queries(_dashboard()).values(), known) == {}


# ------------------------------------------------------------------ the dashboard


def test_every_dashboard_query_parses(promtool, tmp_path):
    dashboard = _dashboard()
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    samples = {**GRAFANA_BUILTINS, **{name: VARIABLE_SAMPLES[name] for name in defined if name in VARIABLE_SAMPLES}}
    queries = {where: _substitute(expr, samples) for where, expr in _dashboard_queries(dashboard).items()}
    assert len(queries) >= 30
    result = _check_exprs(promtool, queries, tmp_path)
    assert result.returncode == 0, (
        result.stdout + result.stderr + "\n" + "\n".join(f"query_{i}: {where}" for i, where in enumerate(queries))
    )


def test_the_query_check_rejects_broken_promql(promtool, tmp_path):
    result = _check_exprs(promtool, {"unbalanced": "sum(rate(mlrelease_gateway_requests_total[5m])"}, tmp_path)
    assert result.returncode != 0


def test_dashboard_structure():
    dashboard = _dashboard()
    assert dashboard["uid"] == "mlrelease-gateway" and dashboard["title"].strip()
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 41
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("cohort", "version", "model"):
        assert variables[name]["type"] == "query" and variables[name]["datasource"] == DATASOURCE_REF, name
        assert variables[name]["definition"].startswith("label_values("), name

    panels = _panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(i for i in ids if ids.count(i) > 1)}"
    for panel in panels:
        assert panel["datasource"] == DATASOURCE_REF, f"panel {panel['id']} {panel['title']}"
        if panel["type"] == "row":  # a row groups panels and runs no query of its own
            continue
        assert panel["targets"], f"panel {panel['id']} {panel['title']} has no query"
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE_REF, f"panel {panel['id']} target {target['refId']}"
    for annotation in dashboard["annotations"]["list"]:
        if "expr" in annotation:
            assert annotation["datasource"] == DATASOURCE_REF, annotation["name"]


def test_dashboard_panels_do_not_overlap():
    cells: dict[tuple[int, int], int] = {}
    for panel in _panels(_dashboard()):
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, f"panel {panel['id']} runs past the 24-column grid"
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"panels {cells[(x, y)]} and {panel['id']} overlap at {(x, y)}"
                cells[(x, y)] = panel["id"]


def test_dashboard_covers_what_operators_need():
    titles = " | ".join(p["title"].lower() for p in _panels(_dashboard()))
    queries = " ".join(_dashboard_queries(_dashboard()).values())
    for name in (
        "mlrelease_gateway_requests_total",
        "mlrelease_gateway_candidate_percent",
        "mlrelease:gateway_model_errors:ratio_rate5m",
        "mlrelease_gateway_request_latency_seconds_bucket",
        "mlrelease:gateway_low_confidence_share:rate5m",
        "mlrelease_gateway_confidence_bucket",
        "mlrelease_gateway_eta_prediction_hours_bucket",
        "mlrelease:gateway_guard_trips:increase10m",
        "mlrelease_gateway_breaker_state",
        "mlrelease_gateway_routing_revision",
        "mlrelease_gateway_feature_latency_seconds_bucket",
        "nv_inference_request_success",
        "mlrelease:triton_queue_seconds_per_request:rate5m",
        "mlrelease:triton_compute_seconds_per_request:rate5m",
        "nv_gpu_utilization",
        "nv_gpu_memory_used_bytes",
        "mlrelease:feature_freshness_lag_seconds",
        "mlrelease_feature_freshness_budget_seconds",
    ):
        assert name in queries, f"the dashboard shows nothing of {name}"
    assert "heatmap" in {p["type"] for p in _panels(_dashboard())} and "p99" in titles


def test_provisioning_points_grafana_at_the_dashboard_folder():
    provider = safe_load((MONITORING / "grafana/provisioning/dashboards/mlrelease.yaml").read_text())
    [entry] = provider["providers"]
    assert entry["type"] == "file" and entry["options"]["path"].startswith("/")
    datasources = safe_load((MONITORING / "grafana/provisioning/datasources/mlrelease-prometheus.yaml").read_text())
    assert [d["type"] for d in datasources["datasources"]] == ["prometheus"]


# ------------------------------------------------------------------ thresholds mirror the plan


def test_guardrail_alerts_mirror_the_rollout_plan():
    plan, alerts = load_plan(), _alerts()
    expr = {name: alert["expr"] for name, alert in alerts.items()}
    assert _threshold(expr["MlreleaseModelErrorRateHigh"], "mlrelease:gateway_model_errors:ratio_rate5m") == (
        _plan_max(plan, "error_rate")
    )
    assert _threshold(expr["MlreleaseModelNaNAnswers"], "mlrelease:gateway_model_failures:increase5m") == (
        _plan_max(plan, "nan_rate")
    )
    # The latency alerts are operational (a ratio of medians and of p99s over 5 minutes, fixed at 1.3 and 3.0):
    # the rollout's latency verdict is the plan's sequential contract, whose tolerance is tighter.
    latency = {g.tolerance for s in plan.stages for g in s.guardrails if g.metric == "latency"}
    p50 = _threshold(
        expr["MlreleaseModelP50LatencyRatioHigh"], "mlrelease:gateway_model_latency_p50:candidate_over_stable_rate5m"
    )
    assert all(1 + t <= p50 for t in latency)
    long_tail = expr["MlreleaseLongTailLowConfidence"]
    assert 'cohort="long_tail"' in long_tail
    assert _threshold(long_tail, "mlrelease:gateway_low_confidence_share:rate5m") == (
        _plan_max(plan, "low_confidence_share", ("long_tail",))
    )


def test_guardrail_alerts_wait_for_the_plans_smallest_sample():
    # the calls-based contracts' smallest sample (answer-based ones count distinct requests, not calls)
    smallest = min(
        g.min_samples
        for s in load_plan().stages
        for g in s.guardrails
        if g.metric in ("error_rate", "nan_rate", "latency")
    )
    guarded = ("MlreleaseModelErrorRateHigh", "MlreleaseLongTailLowConfidence")
    guarded += ("MlreleaseModelP50LatencyRatioHigh", "MlreleaseModelP99LatencyRatioHigh")
    for name in guarded:
        match = re.search(r":rate5m \* 300 >= (\d+)", _alerts()[name]["expr"])
        assert match and int(match.group(1)) == smallest, f"{name} must need {smallest} samples in 5 minutes"


def test_every_plan_guardrail_metric_has_an_alert():
    metrics = {g.metric for s in load_plan().stages for g in s.guardrails}
    # latency_tail (the share beyond stable's p99) is mirrored by the P99 latency ratio alert
    mirrored = {"error_rate", "nan_rate", "latency", "latency_tail", "low_confidence_share"}
    assert metrics - NOT_IN_PROMQL <= mirrored, f"guardrail metrics without an alert: {metrics - mirrored}"


def test_triton_queue_alert_is_a_fifth_of_the_candidate_timeout():
    timeout_s = load_config().guard.candidate_timeout_ms / 1000
    expr = _alerts()["MlreleaseTritonQueueTimeHigh"]["expr"]
    assert _threshold(expr, "mlrelease:triton_queue_seconds_per_request:rate5m") == pytest.approx(timeout_s / 5)

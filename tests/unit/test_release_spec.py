"""Release specs: the repository's model declared in models/<name>/release.yaml, and bad specs named precisely."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from mlrelease.cli import main
from mlrelease.data.schema import PACKAGE_CATEGORIES, REGIONS, USER_TIERS
from mlrelease.errors import StepError
from mlrelease.release_spec import (
    MODEL_ENV,
    SPECS_DIR,
    Task,
    bind_process_model,
    load_spec,
    load_specs,
    process_spec,
)

PARCEL = yaml.safe_load((SPECS_DIR / "parcel_eta" / "release.yaml").read_text(encoding="utf-8"))


def _write(folder: Path, raw: dict, name: str | None = None) -> Path:
    path = folder / (name or raw["name"]) / "release.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def test_the_repository_declares_the_parcel_model_and_the_code_reads_it():
    from mlrelease.model.features import ENTITY_KEYS, FEATURE_SERVICE, FEATURES, TARGET, VOCABULARIES
    from mlrelease.model.onnx_export import OUTPUTS
    from mlrelease.registry import MODEL_NAME

    spec = process_spec()
    assert (spec.name, spec.task) == ("parcel_eta", Task.REGRESSION)
    assert list(load_specs()) == ["late_delivery", "parcel_eta"]
    assert (MODEL_NAME, FEATURE_SERVICE, TARGET) == ("parcel_eta", "parcel_eta_v1", "eta_hours")
    assert ENTITY_KEYS == ("user_id", "package_id", "route_id")
    assert FEATURES == tuple(PARCEL["features"]["columns"]) and len(FEATURES) == 14
    assert OUTPUTS == ("eta_prediction", "confidence_score") == spec.prediction_and_score()
    # The synthetic data's categories are the model's vocabularies: an unseen value would encode as -1.
    assert VOCABULARIES == {"tier": USER_TIERS, "category": PACKAGE_CATEGORIES, "region": REGIONS}


def test_the_repository_declares_a_late_delivery_classifier_on_the_same_network():
    from mlrelease.data.schema import ORDERS
    from mlrelease.release_spec import ClassificationGates

    spec = load_specs()["late_delivery"]
    assert spec.task is Task.BINARY_CLASSIFICATION and isinstance(spec.gates, ClassificationGates)
    assert spec.features.label.column == "is_late" and "is_late" in ORDERS.column_names
    assert spec.prediction_and_score() == ("is_late", "late_probability")
    assert set(spec.features.columns) < set(PARCEL["features"]["columns"])  # a subset of the parcel model's inputs
    assert spec.cohorts.names == ("remote_routes", "bulky", "core")
    assert spec.training_function().__name__ == "fit_gradient_boosting"


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"task": "regresion"}, "task: Input should be 'regression' or 'binary_classification'"),
        ({"name": "Parcel-ETA"}, "name: String should match pattern"),
        ({"featurs": {}}, "featurs: Extra inputs are not permitted"),
        ({"features": {**PARCEL["features"], "columns": ["tier", "tier"]}}, "features: Value error, columns repeat"),
        (
            {"features": {**PARCEL["features"], "vocabularies": {"colour": ["red"]}}},
            "vocabularies name columns the model does not take: ['colour']",
        ),
        (
            {"features": {**PARCEL["features"], "label": {"column": "weight_kg", "table": "packages"}}},
            "the label 'weight_kg' is also an input column",
        ),
        (
            {"outputs": [{"name": "a", "role": "prediction"}, {"name": "b", "role": "prediction"}]},
            "outputs: exactly one prediction and at most one score",
        ),
        ({"outputs": [{"name": "a", "role": "answer"}]}, "outputs.0.role: Input should be 'prediction' or 'score'"),
        ({"outputs": []}, "outputs: Tuple should have at least 1 item"),
        ({"training": {**PARCEL["training"], "holdout_share": 0.7}}, "training.holdout_share: Input should be less"),
        ({"training": {"params": {}}}, "training.entrypoint: Field required"),
        (
            {"gates": {"min_confidence_ratio": 0.5}},
            "gates: Value error, the gates of a regression model: min_confidence_ratio: Input should be greater",
        ),
        ({"perf": {"min_throughput_ratio": 1.5}}, "perf.min_throughput_ratio: Input should be less than or equal"),
        ({"perf": {"peak_batch": 0}}, "perf.peak_batch: Input should be greater than or equal to 1"),
        ({"rollout_plan": ""}, "rollout_plan: String should have at least 1 character"),
        ({"fallback": {"values": {"confidence_score": 0.3}}}, "fallback: no answer for output(s) ['eta_prediction']"),
        (
            {"fallback": {"values": {"eta_prediction": 9, "confidence_score": 0.3, "eta": 9}}},
            "fallback.values names no output: ['eta']",
        ),
        (
            {"fallback": {"values": {"eta_prediction": 9, "confidence_score": 1.3}}},
            "fallback.values.confidence_score 1.3 is outside that output's range [0, 1]",
        ),
        ({"fallback": {"params": {"a": 1.0}, "values": {"eta_prediction": 9, "confidence_score": 0.3}}}, "without"),
        (
            {
                "outputs": [
                    {"name": "eta_prediction", "role": "prediction", "range": [5, 1]},
                    {"name": "confidence_score", "role": "score"},
                ]
            },
            "outputs.0: Value error, range [5.0, 1.0] must be [lowest, highest]",
        ),
        ({"fallback": None}, "fallback: Input should be a valid dictionary"),
    ],
    ids=[
        "task",
        "name",
        "typo",
        "repeat",
        "vocabulary",
        "label",
        "two-predictions",
        "role",
        "no-outputs",
        "holdout",
        "no-entrypoint",
        "gate",
        "throughput",
        "peak-batch",
        "plan",
        "fallback-missing",
        "fallback-unknown",
        "fallback-range",
        "fallback-params",
        "output-range",
        "no-fallback",
    ],
)
def test_a_bad_spec_is_refused_naming_the_file_and_the_field(tmp_path, change, complaint):
    path = _write(tmp_path, {**PARCEL, **change}, name="parcel_eta")
    with pytest.raises(StepError) as caught:
        load_spec(path)
    assert str(caught.value).startswith(f"release spec {path} is invalid: ")
    assert complaint in str(caught.value)


def test_a_spec_named_unlike_its_folder_is_refused(tmp_path):
    path = _write(tmp_path, {**PARCEL, "name": "late_delivery"}, name="parcel_eta")
    with pytest.raises(StepError, match="name: 'late_delivery' differs from its folder 'parcel_eta'"):
        load_spec(path)


def test_an_empty_specs_folder_is_a_clear_error(tmp_path):
    with pytest.raises(StepError, match=f"no release spec in {tmp_path}"):
        load_specs(tmp_path)


def test_a_process_releases_the_model_it_names_or_the_only_one(tmp_path, monkeypatch):
    one, two = tmp_path / "one", tmp_path / "two"
    _write(one, PARCEL)
    _write(two, PARCEL)
    _write(two, {**PARCEL, "name": "late_delivery"})
    assert list(load_specs(two)) == ["late_delivery", "parcel_eta"]
    monkeypatch.delenv(MODEL_ENV, raising=False)
    assert process_spec(one).name == "parcel_eta"  # the only one declared
    with pytest.raises(StepError, match=rf"declares 2 models \(late_delivery, parcel_eta\): set {MODEL_ENV}"):
        process_spec(two)
    monkeypatch.setenv(MODEL_ENV, "late_delivery")
    assert process_spec(two).name == "late_delivery"
    monkeypatch.setenv(MODEL_ENV, "route_risk")
    with pytest.raises(
        StepError, match=r"no model 'route_risk' is declared in .* \(declared: late_delivery, parcel_eta\)"
    ):
        process_spec(two)


def test_binding_a_process_to_another_model_than_it_runs_is_refused(monkeypatch):
    monkeypatch.setenv(MODEL_ENV, "parcel_eta")
    bind_process_model("parcel_eta", named_by="gateway.yaml")  # the same model: fine
    with pytest.raises(
        StepError, match="gateway.yaml names model 'late_delivery', but MLRELEASE_MODEL is 'parcel_eta'"
    ):
        bind_process_model("late_delivery", named_by="gateway.yaml")
    monkeypatch.delenv(MODEL_ENV)
    bind_process_model("late_delivery", named_by="gateway.yaml")
    assert os.environ[MODEL_ENV] == "late_delivery"


def test_serving_needs_a_score_output(tmp_path):
    prediction_only = [{"name": "eta_prediction", "role": "prediction"}]
    only = {"outputs": prediction_only, "fallback": {"values": {"eta_prediction": 9}}}
    spec = load_spec(_write(tmp_path, {**PARCEL, **only}))
    assert spec.score is None and spec.prediction.name == "eta_prediction"
    with pytest.raises(StepError, match="model parcel_eta: its release spec declares no score output"):
        spec.prediction_and_score()


def test_models_list_prints_every_declared_model(tmp_path, capsys):
    _write(tmp_path, PARCEL)
    _write(tmp_path, {**PARCEL, "name": "late_delivery", "task": "binary_classification", "gates": {}})
    assert main(["models", "list", "--specs", str(tmp_path)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(m["name"], m["task"]) for m in listed["models"]] == [
        ("late_delivery", "binary_classification"),
        ("parcel_eta", "regression"),
    ]
    assert listed["models"][1]["outputs"] == {"eta_prediction": "prediction", "confidence_score": "score"}
    assert listed["models"][1]["spec"] == str(tmp_path / "parcel_eta" / "release.yaml")
    assert listed["models"][1]["rollout_plan"] == "config/rollout_plan.yaml"


def test_models_list_runs_without_a_process_model(monkeypatch, capsys):
    from mlrelease.entry import main as console_script

    monkeypatch.delenv(MODEL_ENV, raising=False)  # two declared, none named: every other command refuses
    assert console_script(["models", "list"]) == 0
    assert [m["name"] for m in json.loads(capsys.readouterr().out)["models"]] == ["late_delivery", "parcel_eta"]


def test_models_list_fails_on_a_bad_spec_with_one_line(tmp_path, capsys):
    _write(tmp_path, {**PARCEL, "task": "ranking"})
    assert main(["models", "list", "--specs", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "release spec" in err[0] and "task: Input should be" in err[0]


def test_each_model_keeps_its_run_artifacts_and_gateway_state_apart(home, monkeypatch):
    from mlrelease.gateway.config import load_config
    from mlrelease.settings import Settings

    found = {}
    for model in ("parcel_eta", "late_delivery"):  # the repository's two models, one process each
        monkeypatch.setenv(MODEL_ENV, model)
        settings = Settings.from_env()
        config = load_config(model=model)
        found[model] = (settings.artifacts_dir, config.state_url(settings), config.decision_dir(settings))
    assert found["parcel_eta"][0] == home / "artifacts" / "parcel_eta"
    assert found["late_delivery"] == (
        home / "artifacts" / "late_delivery",
        f"file://{home / 'gateway' / 'late_delivery' / 'routing.json'}",
        home / "gateway" / "late_delivery" / "decisions",
    )
    assert not set(found["parcel_eta"]) & set(found["late_delivery"])  # a same-night run key cannot collide


@pytest.mark.parametrize("name", sorted(load_specs()))
def test_each_shipped_spec_names_a_rollout_plan_over_its_own_cohorts_that_suits_its_task(name):
    from mlrelease.rollout.plan import load_plan

    spec = load_specs()[name]
    plan = load_plan(spec.rollout_plan_path)  # loading runs the power check at the plan's declared traffic
    plan.check_cohorts(spec.cohorts.names)
    plan.check_task(spec.task)
    assert set(plan.traffic["production"].requests_per_s) == set(spec.cohorts.names)


def test_a_classifier_judged_by_an_eta_shift_or_a_confidence_threshold_is_refused():
    from mlrelease.rollout.plan import load_plan

    parcel_plan = load_plan(load_specs()["parcel_eta"].rollout_plan_path)
    with pytest.raises(StepError, match="judges a binary_classification model by low_confidence_share, prediction"):
        parcel_plan.check_task("binary_classification")
    parcel_plan.check_task("regression")


def test_a_models_steps_and_form_default_to_its_specs_perf_limits_and_plan(tmp_path):
    """A process releasing a model whose spec declares other limits: its flags and DAG form default to them."""
    import subprocess
    import sys

    specs = tmp_path / "models"
    perf = {"max_p99_ratio": 1.3, "min_throughput_ratio": 0.75, "peak_concurrency": 8, "peak_batch": 4}
    _write(specs, {**PARCEL, "name": "route_eta", "perf": perf, "rollout_plan": "plans/route_eta.yaml"})
    _write(specs, PARCEL)
    # What the benchmark step is given when run without the flags (and with one), and the model's DAG form.
    probe = (
        "import json, sys, mlrelease.steps.benchmark as b; from mlrelease.cli import build_parser, _step_benchmark; "
        "from mlrelease.release_spec import process_spec; from mlrelease.stepdefs import nightly_params; "
        "seen = {}; b.benchmark = lambda settings, version, **kw: seen.update(kw) or {}; "
        "argv = ['step', 'benchmark', '--model-version', '1', *sys.argv[1:]]; "
        "_step_benchmark(build_parser().parse_args(argv), None); "
        "form = {p.name: p.default for p in nightly_params(process_spec())}; "
        "print(json.dumps([seen['max_p99_ratio'], seen['min_throughput_ratio'], seen['perf'].peak_concurrency, "
        "seen['perf'].peak_batch, form['max_p99_ratio'], form['min_throughput_ratio'], form['rollout_plan']]))"
    )
    env = {**os.environ, "MLRELEASE_SPECS_DIR": str(specs), MODEL_ENV: "route_eta"}

    def probed(*flags: str) -> list[object]:
        done = subprocess.run([sys.executable, "-c", probe, *flags], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    assert probed() == [1.3, 0.75, 8, 4, 1.3, 0.75, "plans/route_eta.yaml"]
    assert probed("--max-p99-ratio", "2", "--peak-batch", "2") == [2.0, 0.75, 8, 2, 1.3, 0.75, "plans/route_eta.yaml"]
    env[MODEL_ENV] = "parcel_eta"  # the shipped parcel spec's values, as before specs declared them
    assert probed() == [1.1, 0.9, 16, 16, 1.1, 0.9, "config/rollout_plan.yaml"]


def test_a_fallback_rule_that_cannot_be_imported_is_named_when_the_gateway_builds_its_answer(tmp_path):
    fallback = {"rule": "team_rules:eta", "values": {"confidence_score": 0.3}}
    spec = load_spec(_write(tmp_path, {**PARCEL, "fallback": fallback}))
    with pytest.raises(StepError, match=r"release spec .*: fallback.rule 'team_rules:eta': module team_rules cannot"):
        spec.fallback_answer()


def test_fallback_params_that_do_not_fit_the_rule_are_named_before_the_gateway_serves(tmp_path):
    fallback = {**PARCEL["fallback"], "params": {**PARCEL["fallback"]["params"], "km_per_hr": 55}}
    spec = load_spec(_write(tmp_path, {**PARCEL, "fallback": fallback}))
    with pytest.raises(
        StepError, match=r"fallback.params .* do not fit mlrelease.gateway.fallback:eta_rule: .*km_per_hr"
    ):
        spec.fallback_answer()


def test_the_rules_prediction_stays_inside_the_outputs_range():
    answer = load_specs()["parcel_eta"].fallback_answer()
    far = {"distance_km": 50_000.0, "congestion_index": 1.0, "is_remote": True}  # ~1,660 h by the rule
    assert answer(far)["eta_prediction"] == 500.0  # the spec's range: what a version may answer at most
    assert answer({"distance_km": 110.0})["eta_prediction"] == pytest.approx(10.0)

"""Train → export → validate-serving → benchmark against a real Triton server and the real perf_analyzer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from mlrelease.data.generate import generate
from mlrelease.errors import GateFailed, StepError
from mlrelease.model.features import FEATURES
from mlrelease.registry import CHALLENGER, CHAMPION, MODEL_NAME, Registry
from mlrelease.serving import local_triton
from mlrelease.serving.perf import PerfSettings
from mlrelease.serving.triton_client import TritonClient
from mlrelease.serving.triton_repo import model_repository, parity_file, parse_pbtxt, version_dir
from mlrelease.settings import Settings
from mlrelease.steps.apply_features import apply_features
from mlrelease.steps.benchmark import benchmark
from mlrelease.steps.export import export
from mlrelease.steps.train import train
from mlrelease.steps.validate_data import validate_data
from mlrelease.steps.validate_serving import validate_serving
from mlrelease.timewindow import Window
from tests.conftest import HISTORY, WINDOW_END, WINDOW_START, free_port

pytestmark = pytest.mark.integration
WINDOW = Window.parse(WINDOW_START, WINDOW_END)
NEXT_WINDOW = Window(WINDOW.start + timedelta(days=1), WINDOW.end + timedelta(days=1))
FAST_PERF = PerfSettings(rounds=6)  # for a bootstrap (one round) and steps refused before perf_analyzer runs


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[Settings]:
    """One MLRELEASE_HOME with history, applied features, a real tritonserver, and v1 bootstrapped to champion."""
    home = tmp_path_factory.mktemp("model-world")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLRELEASE_HOME", str(home))
        mp.setenv("MLRELEASE_XCOM_PATH", str(home / "xcom.json"))
        for name in ("HTTP", "GRPC", "METRICS"):
            mp.setenv(f"MLRELEASE_TRITON_{name}_PORT", str(free_port()))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.delenv("MLRELEASE_TRITON_URL", raising=False)
        mp.chdir(home)
        generate(home / "data/offline", HISTORY[0], HISTORY[1] + timedelta(days=1), rows_per_day=500, seed=3)
        settings = Settings.from_env()
        apply_features(settings)
        # Train learns only from partitions that passed validate-data: approve every day the tests train on
        # (WINDOW's and NEXT_WINDOW's seven training days).
        validate_data(settings, Window(WINDOW.start, NEXT_WINDOW.end), training_days=8)
        local_triton.up(settings)
        try:
            yield settings
        finally:
            local_triton.down(settings)


@pytest.fixture(scope="module")
def bootstrapped(world) -> dict:
    """v1 trained, exported, validated on Triton and benchmarked; with no champion it becomes champion."""
    trained = train(world, WINDOW)
    version = trained["model_version"]
    return {
        "train": trained,
        "export": export(world, version),
        "validate": validate_serving(world, version),
        "benchmark": benchmark(world, version, perf=FAST_PERF),
    }


def _client() -> TritonClient:
    return TritonClient(local_triton.Ports.from_env().http_url)


def test_bootstrap_chain(world, bootstrapped):
    registry = Registry.from_settings(world)
    assert bootstrapped["train"]["model_version"] == 1
    assert bootstrapped["train"]["decision"].startswith("bootstrap: no champion yet")
    assert bootstrapped["train"]["metrics"]["confidence_error_ratio"] > 1.2
    assert registry.alias_version(CHALLENGER) == 1 and registry.alias_version(CHAMPION) == 1
    assert bootstrapped["benchmark"]["status"].startswith("bootstrap")
    tags = registry.version_tags(1)
    assert tags["validation_status"] == "passed" and tags["benchmark_status"] == "passed"
    assert tags["export_status"] == "exported"

    run = registry.client().get_run(registry.run_id(1))
    assert run.data.tags["decision"] == "accepted" and len(run.data.tags["git_commit"]) >= 7
    assert run.data.params["feature_service"] == "parcel_eta_v1"
    assert {"mae", "p90_abs_error", "confidence_error_ratio", "perf_p99_us_c1"} <= set(run.data.metrics)
    artifacts = {a.path for a in registry.client().list_artifacts(run.info.run_id, "benchmark")}
    assert "benchmark/latency_vs_concurrency.png" in artifacts and any(a.endswith(".csv") for a in artifacts)

    root = model_repository(world)
    meta = json.loads((version_dir(root, MODEL_NAME, 1) / "model_config.json").read_text())
    assert meta["mlflow_run_id"] == run.info.run_id and meta["input_schema"]["columns"] == list(FEATURES)
    assert len(meta["sha256"]) == 64


def test_registered_version_follows_mlflow_conventions(world, bootstrapped, tmp_path):
    """Signature and input example on the registered model; the served ONNX as an mlflow.onnx model; the window."""
    import mlflow
    from mlflow.models import Model

    from mlrelease.model.tracking import logged_onnx_bytes

    registry = Registry.from_settings(world)
    client = registry.client()
    info = mlflow.models.get_model_info(f"models:/{MODEL_NAME}/1")
    assert "sklearn" in info.flavors
    (spec,) = info.signature.inputs.to_dict()
    assert spec["tensor-spec"] == {"dtype": "float32", "shape": (-1, len(FEATURES))}
    assert info.metadata["input_columns"] == list(FEATURES)
    local = mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{MODEL_NAME}/1", dst_path=str(tmp_path))
    example = Model.load(local).load_input_example(local)
    assert example.shape == (5, len(FEATURES)) and example.dtype == np.float32  # small: five encoded rows

    # The ONNX file Triton serves, with the mlflow.onnx flavor, in the same run, pointed to by the version's tags.
    tags = registry.version_tags(1)
    onnx_info = mlflow.models.get_model_info(tags["onnx_model_uri"])
    assert {"onnx", "python_function"} <= set(onnx_info.flavors) and onnx_info.run_id == registry.run_id(1)
    assert onnx_info.model_id == tags["onnx_model_id"]
    assert [o["name"] for o in onnx_info.signature.outputs.to_dict()] == ["eta_prediction", "confidence_score"]
    served = (version_dir(model_repository(world), MODEL_NAME, 1) / "model.onnx").read_bytes()
    assert logged_onnx_bytes(client, tags["onnx_model_id"]) == served  # byte-identical, not a re-serialization
    assert client.get_logged_model(tags["onnx_model_id"]).tags["onnx_sha256"] == tags["onnx_sha256"]

    # The training window as the run's dataset input.
    (dataset_input,) = client.get_run(registry.run_id(1)).inputs.dataset_inputs
    input_tags = {t.key: t.value for t in dataset_input.tags}
    assert input_tags["mlflow.data.context"] == "training"
    training_start = (WINDOW.end - timedelta(days=7)).isoformat()
    assert dataset_input.dataset.name == f"parcel_eta_v1 {training_start}/{WINDOW.end.isoformat()}"
    assert json.loads(dataset_input.dataset.source) == {"uri": (world.offline_dir / "orders").as_uri()}
    assert input_tags["window_start"] == training_start and input_tags["window_end"] == WINDOW.end.isoformat()
    assert input_tags["partitions.orders"] == "date=2026-11-22..2026-11-29 (8)"
    assert json.loads(dataset_input.dataset.profile)["num_rows"] >= 500  # the whole window, before the split


def test_served_config_matches_what_we_wrote(world, bootstrapped):
    written = parse_pbtxt((model_repository(world) / MODEL_NAME / "config.pbtxt").read_text())
    reported = _client().model_config(MODEL_NAME, 1)
    assert reported["max_batch_size"] == written.max_batch_size
    assert [(i["name"], [int(d) for d in i["dims"]], i["data_type"]) for i in reported["input"]] == [
        ("features", [len(FEATURES)], "TYPE_FP32")
    ]
    assert sorted(o["name"] for o in reported["output"]) == ["confidence_score", "eta_prediction"]
    assert int(reported["dynamic_batching"]["max_queue_delay_microseconds"]) == 500
    assert reported["backend"] == "python"  # the local CPU translation of the onnxruntime config


def test_reruns_are_no_ops(world, bootstrapped):
    again = train(world, WINDOW)
    assert again["model_version"] == 1 and again["status"] == "already trained for this data interval"
    onnx_file = version_dir(model_repository(world), MODEL_NAME, 1) / "model.onnx"
    before = onnx_file.stat().st_mtime_ns
    parity_file(world, 1).unlink()  # as if the first try died after publishing the version
    onnx_models = registry_onnx_models(world)
    assert export(world, 1)["status"] == "already exported; version files unchanged"
    assert onnx_file.stat().st_mtime_ns == before
    assert registry_onnx_models(world) == onnx_models, "a rerun logs no second mlflow.onnx copy"
    assert parity_file(world, 1).is_file(), "a rerun completes what an interrupted export left undone"


def test_repository_version_from_another_run_is_refused(world, bootstrapped):
    import shutil

    version = _register_copy(world, lambda m: None)
    root = model_repository(world)
    shutil.copytree(version_dir(root, MODEL_NAME, 1), version_dir(root, MODEL_NAME, version))
    try:
        with pytest.raises(StepError, match="the repository and the registry disagree"):
            export(world, version)
    finally:
        shutil.rmtree(version_dir(root, MODEL_NAME, version))


def test_refused_candidate_registers_nothing(world, bootstrapped):
    registry = Registry.from_settings(world)
    versions_before = len(registry.client().search_model_versions(f"name = '{MODEL_NAME}'"))
    with pytest.raises(GateFailed, match="candidate refused: confidence does not track error"):
        train(world, Window(WINDOW.start, WINDOW.end + timedelta(hours=1)), min_confidence_ratio=100)
    assert len(registry.client().search_model_versions(f"name = '{MODEL_NAME}'")) == versions_before
    rejected = registry.client().search_runs([registry.experiment_id()], "tags.decision = 'rejected'")
    assert rejected and rejected[0].info.status == "FAILED"
    assert rejected[0].data.tags["decision_reason"].startswith("confidence does not track error")


def registry_onnx_models(world: Settings) -> list[str]:
    """Ids of the ONNX models logged in the experiment."""
    registry = Registry.from_settings(world)
    found = registry.client().search_logged_models([registry.experiment_id()], filter_string="name = 'onnx'")
    return sorted(m.model_id for m in found)


def _register_copy(world: Settings, tweak) -> int:
    """Register a copy of v1's model, changed by `tweak`, as a new version with its own run (for bad inputs)."""
    import mlflow

    registry = Registry.from_settings(world)
    model = registry.load_native(1)
    tweak(model)
    with mlflow.start_run(experiment_id=registry.experiment_id(), run_name="bad-input") as run:
        mlflow.log_artifact(_sample_file(world), "")
        info = mlflow.sklearn.log_model(model, name="model", serialization_format="cloudpickle")
    version = int(mlflow.register_model(info.model_uri, MODEL_NAME).version)
    assert run.info.run_id
    return version


def _sample_file(world: Settings) -> str:
    path = Path(world.home) / "parity_sample.npy"
    if not path.exists():
        np.save(path, np.load(parity_file(world, 1))["features"])
    return str(path)


def test_nan_emitting_model_is_refused_at_export(world, bootstrapped):
    version = _register_copy(world, lambda m: setattr(m, "k_", float("nan")))
    with pytest.raises(GateFailed, match=f"version {version} emits NaN/inf"):
        export(world, version)
    assert Registry.from_settings(world).version_tags(version)["export_status"] == "failed"
    assert not version_dir(model_repository(world), MODEL_NAME, version).exists()


def _publish_broken(world: Settings, version: int, model_bytes: bytes) -> None:
    """Put a version into the repository (and its served set) as a broken export would."""
    from mlrelease.serving.triton_repo import write_config, write_version

    root = model_repository(world)
    write_version(root, MODEL_NAME, version, model_bytes, {"note": "deliberately broken"})
    config = parse_pbtxt((root / MODEL_NAME / "config.pbtxt").read_text())
    config.version_policy.specific.versions.append(version)
    write_config(root, config)
    expected = np.load(parity_file(world, 1))
    parity_file(world, version).parent.mkdir(parents=True, exist_ok=True)
    np.savez(parity_file(world, version), **{k: expected[k] for k in expected.files})


@pytest.mark.parametrize("breakage", ["corrupted model.onnx", "mismatched input dims"])
def test_broken_version_fails_serving_and_champion_keeps_serving(world, bootstrapped, breakage):
    from mlrelease.model.estimator import EtaModel
    from mlrelease.model.onnx_export import to_onnx

    version = _register_copy(world, lambda m: None)
    if breakage == "corrupted model.onnx":
        model_bytes = (version_dir(model_repository(world), MODEL_NAME, 1) / "model.onnx").read_bytes()[:2000]
    else:
        rng = np.random.default_rng(0)
        narrow = EtaModel(max_iter=5).fit(rng.random((300, len(FEATURES) - 1)), rng.random(300))
        model_bytes = to_onnx(narrow)
    _publish_broken(world, version, model_bytes)
    with pytest.raises(GateFailed, match=f"version {version} failed serving validation"):
        validate_serving(world, version)
    with pytest.raises(GateFailed, match=f"version {version} already failed serving validation"):
        validate_serving(world, version)  # a retry must not load the retired version next to the champion
    client = _client()
    assert client.version_ready(MODEL_NAME, 1), "the champion must keep serving"
    assert not client.version_ready(MODEL_NAME, version)
    answer = client.infer(MODEL_NAME, 1, np.load(parity_file(world, 1))["features"][:3], ("eta_prediction",))
    assert np.isfinite(answer["eta_prediction"]).all()
    served = parse_pbtxt((model_repository(world) / MODEL_NAME / "config.pbtxt").read_text())
    assert version not in served.version_policy.specific.versions
    assert Registry.from_settings(world).version_tags(version)["validation_status"] == "failed"


def test_second_candidate_is_benchmarked_against_the_champion(world, bootstrapped):
    """A healthy retrained candidate (same quality, its own bytes) passes the shipped gate, limits and test alike."""
    trained = train(world, NEXT_WINDOW)
    version = trained["model_version"]
    assert trained["champion_version"] == 1 and "vs champion" in trained["decision"]
    exported = export(world, version)
    assert exported["served_versions"] == [1, version]
    served = [(version_dir(model_repository(world), MODEL_NAME, v) / "model.onnx").read_bytes() for v in (1, version)]
    assert served[0] != served[1]  # retrained, not a copy: the gate must tell "as fast" from "the very same"
    validate_serving(world, version)
    result = benchmark(world, version)  # p99 x1.10, throughput x0.90, PerfSettings(): what the nightly run uses
    perf = PerfSettings()
    assert result["status"] == "passed" and result["planned_rounds"] == perf.rounds
    assert result["harmed_rounds"] < result["fail_at"] == 8 and result["false_fail_rate"] == pytest.approx(10 / 512)
    # It stopped once the test of 9 rounds was settled: at its second unharmed round, 8 of 9 can no longer be reached.
    assert result["rounds"] - result["harmed_rounds"] == perf.rounds - result["fail_at"] + 1 == 2
    assert set(result["levels"]) == {f"challenger v{version}", "champion v1"}
    assert [(lv["concurrency"], lv["batch"]) for lv in result["levels"]["champion v1"]] == list(perf.levels)
    assert set(result["first_in_round"]) <= {"challenger", "champion"}
    assert len(result["first_in_round"]) == len(result["round_statistics"]) == result["rounds"]
    assert Registry.from_settings(world).alias_version(CHAMPION) == 1  # promotion is not the benchmark's job


def test_a_candidate_whose_batches_cost_much_more_is_refused_by_the_shipped_gate(world, bootstrapped, monkeypatch):
    """Right answers, a single row about as fast, but a batch of 16 rows ~20x a batch of 1: refused at the peak."""
    from mlrelease.steps.export import DRILL_ENV

    # Its own data interval (half a day later), so train registers a new version of the champion's quality.
    window = Window(WINDOW.start + timedelta(hours=12), WINDOW.end + timedelta(hours=12))
    version = train(world, window)["model_version"]
    monkeypatch.setenv(DRILL_ENV, "batch_cost")  # what `make run CANDIDATE_FAULT=batch_cost` injects at export
    export(world, version)
    monkeypatch.delenv(DRILL_ENV)
    validate_serving(world, version)  # its answers are the model's, bit for bit: every correctness check passes
    too_slow = rf"version {version} is too slow against champion 1 \(9 paired rounds(, settled after 8)?\)"
    with pytest.raises(GateFailed, match=too_slow):
        benchmark(world, version)  # the shipped limits and PerfSettings()
    tags = Registry.from_settings(world).version_tags(version)
    assert tags["drill_fault"] == "batch_cost" and tags["benchmark_status"] == "failed"
    assert tags["benchmark_reason"].startswith("beyond the tolerance (p99 x1.1, throughput x0.9)")


def test_triton_down_is_a_clear_error_that_changes_nothing(world, bootstrapped, monkeypatch):
    config_file = model_repository(world) / MODEL_NAME / "config.pbtxt"
    before = config_file.read_text()
    monkeypatch.setenv("MLRELEASE_TRITON_HTTP_PORT", str(free_port()))
    with pytest.raises(StepError, match=r"Triton at http://127.0.0.1:\d+ is not reachable.*mlrelease triton up"):
        validate_serving(world, 1)
    assert config_file.read_text() == before  # an outage is not a verdict: a retry can still succeed
    assert Registry.from_settings(world).version_tags(1)["validation_status"] == "passed"


def test_perf_analyzer_failure_is_reported(world, bootstrapped, tmp_path):
    from mlrelease.serving.local_triton import TritonPaths, toolchain_env
    from mlrelease.serving.perf import run_perf_analyzer

    paths = TritonPaths.from_settings(world)
    with pytest.raises(StepError, match="perf_analyzer failed on no_such_model version 1"):
        run_perf_analyzer(
            paths.perf_analyzer,
            toolchain_env(paths),
            local_triton.Ports.from_env().http_url,
            "no_such_model",
            1,
            tmp_path / "x.csv",
            FAST_PERF,
        )


def test_champion_missing_from_the_repository_is_named(world, bootstrapped):
    registry = Registry.from_settings(world)
    ghost = _register_copy(world, lambda m: None)
    registry.client().set_registered_model_alias(MODEL_NAME, CHAMPION, str(ghost))
    try:
        with pytest.raises(StepError, match=f"version {ghost} is not in the model repository"):
            benchmark(world, 1, perf=FAST_PERF)
    finally:
        registry.client().set_registered_model_alias(MODEL_NAME, CHAMPION, "1")


def test_triton_dropping_the_connection_mid_validation_retires_nothing(world, bootstrapped, monkeypatch):
    from mlrelease.serving.triton_client import TritonClient as Client
    from mlrelease.serving.triton_client import TritonUnreachable

    def dropped(self, model, config=None):
        raise TritonUnreachable("loading parcel_eta: connection reset")

    config_file = model_repository(world) / MODEL_NAME / "config.pbtxt"
    monkeypatch.setattr(Client, "load", dropped)
    with pytest.raises(TritonUnreachable):
        validate_serving(world, 1)
    assert 1 in parse_pbtxt(config_file.read_text()).version_policy.specific.versions  # still to be served
    assert Registry.from_settings(world).version_tags(1)["validation_status"] == "passed"

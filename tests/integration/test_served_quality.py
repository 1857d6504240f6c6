"""The shadow gate judges quality on the served graph: a real Triton answers labelled orders for both versions.

A candidate with the champion's very ETAs but a confidence that no longer means anything (every answer
clipped to 1.0, as an overconfident export would give) passes every ETA comparison and the latency test;
only the served-quality contract (calibration on the orders' actual ETAs) refuses it, before any traffic.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from mlrelease.errors import GateFailed
from mlrelease.model.features import FEATURES
from mlrelease.model.onnx_export import OUTPUTS, to_onnx
from mlrelease.registry import CHAMPION, MODEL_NAME, Registry
from mlrelease.serving import local_triton
from mlrelease.serving.triton_client import TritonClient
from mlrelease.settings import Settings
from mlrelease.steps.shadow import shadow
from mlrelease.timewindow import parse_timestamp, run_key
from mlrelease_drills import devkit
from mlrelease_drills.faults import faulty_model
from tests.conftest import WINDOW_END, free_port

pytestmark = pytest.mark.integration
END = parse_timestamp(WINDOW_END, name="end")
CHAMPION_V, OVERCONFIDENT, SAME = 1, 2, 3
# The quality contract at the repo's defaults; latency is not what this file tests (a 2-core box is noisy).
PLAN = {
    "shadow": {
        "samples": 600,
        "latency_tolerance": 0.5,
        "latency_min_pairs": 50,
        "latency_max_pairs": 200,
        "latency_on_inconclusive": "accept",
    },
    "stages": [
        {
            "name": "everyone",
            "candidate_percent": {"*": 95},
            "min_exposure_s": {"production": 60, "demo": 1},
            "max_exposure_s": {"production": 120, "demo": 2},
            "guardrails": [{"metric": "error_rate", "bad": "higher", "tolerance": 0.001}],
        }
    ],
}


@pytest.fixture(scope="module")
def world(tmp_path_factory, clean_offline) -> Iterator[tuple[Settings, Path]]:
    """A real Triton serving the champion, an overconfident copy and an identical copy; MLflow knows all three."""
    home = tmp_path_factory.mktemp("served-quality") / "home"
    shutil.copytree(clean_offline, home / "data" / "offline")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLRELEASE_HOME", str(home))
        mp.setenv("MLRELEASE_XCOM_PATH", str(home / "xcom.json"))
        mp.delenv("MLRELEASE_TRITON_URL", raising=False)
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        for name in ("HTTP", "GRPC", "METRICS"):
            mp.setenv(f"MLRELEASE_TRITON_{name}_PORT", str(free_port()))
        mp.chdir(home)
        settings = Settings.from_env()
        model, _ = devkit.quick_model(settings.offline_dir, max_iter=40)
        good = to_onnx(model)
        versions = {
            CHAMPION_V: good,
            # ×50 then clipped to [0, 1]: every served confidence becomes exactly 1.0, the ETAs stay the champion's
            OVERCONFIDENT: faulty_model(good, "scale", output="confidence_score", factor=50.0),
            SAME: good,
        }
        cpu_root = local_triton.TritonPaths.from_settings(settings).cpu_repository
        devkit.stage_repository(home / "model_repository", cpu_root, versions)
        local_triton.up(settings)
        try:
            _load_and_warm(local_triton.Ports.from_env().http_url, list(versions))
            client = Registry.from_settings(settings).client()
            client.create_registered_model(MODEL_NAME)
            for version in versions:
                assert int(client.create_model_version(MODEL_NAME, source=str(home), run_id=None).version) == version
            client.set_registered_model_alias(MODEL_NAME, CHAMPION, str(CHAMPION_V))
            plan = home / "plan.yaml"
            plan.write_text(yaml.safe_dump(PLAN), encoding="utf-8")
            yield settings, plan
        finally:
            local_triton.down(settings)


def _load_and_warm(url: str, versions: list[int]) -> None:
    """Load every version and warm it: a version's first calls after a load are several times slower."""
    client = TritonClient(url)
    try:
        client.load(MODEL_NAME)
        for version in versions:
            client.wait_ready(MODEL_NAME, version)
            for _ in range(30):
                client.infer(MODEL_NAME, version, np.zeros((1, len(FEATURES)), dtype=np.float32), OUTPUTS)
    finally:
        client.close()  # an idle keep-alive connection would hold the server's shutdown


def _report(settings: Settings) -> dict:
    return json.loads((settings.artifacts_dir / run_key(END) / "rollout" / "shadow.json").read_text())


def test_an_overconfident_candidate_is_refused_by_shadow_before_any_traffic(world):
    settings, plan = world
    with pytest.raises(GateFailed, match="served confidence does not track error") as failed:
        shadow(settings, OVERCONFIDENT, END, plan_path=plan)
    assert "constant at 1, it carries no information" in str(failed.value)
    report = _report(settings)
    assert report["status"] == "failed"
    # the ETAs are the champion's: every existing comparison passes, only the served quality refuses it
    assert report["disagreement_share"] == 0.0 and report["non_finite"] == 0
    assert {s["verdict"] for s in report["eta_shift_by_cohort"].values()} == {"pass"}
    quality = report["served_quality"]
    assert quality["rows"] == report["rows"] and quality["verdict"] == "fail"
    assert quality["calibration"] == {**quality["calibration"], "ratio": 1.0, "band": [1.0, 1.0], "verdict": "fail"}
    assert quality["mae"]["verdict"] == quality["p90_abs_error"]["verdict"] == "pass"
    assert quality["champion_confidence_error_ratio"] > 1.2  # the champion's served confidence does track error
    tags = Registry.from_settings(settings).version_tags(OVERCONFIDENT)
    assert tags["shadow_status"] == "failed" and "served confidence does not track error" in tags["shadow_reason"]


def test_a_candidate_serving_the_same_answers_passes_with_its_quality_on_record(world):
    settings, plan = world
    report = shadow(settings, SAME, END, plan_path=plan)
    assert report["status"] == "passed" and _report(settings)["status"] == "passed"
    quality = report["served_quality"]
    assert quality["verdict"] == "pass" and quality["calibration"]["band"][1] >= 1.2
    assert quality["mae"]["relative"] == 0.0 and quality["mae"]["excess_band_h"][1] < 0
    assert {c["difference"] for c in quality["low_confidence_by_cohort"].values()} == {0.0}
    assert Registry.from_settings(settings).version_tags(SAME)["shadow_status"] == "passed"

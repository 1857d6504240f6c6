"""Reconcile serves one version at a time: a refused version (swapped file, refused load) never takes the rest down."""

from __future__ import annotations

import pytest

from mlrelease.errors import StepError
from mlrelease.serving import endpoint, reconcile
from mlrelease.serving.triton_repo import (
    ServingConfig,
    build_config,
    model_repository,
    parse_pbtxt,
    write_config,
    write_version,
)
from mlrelease.settings import Settings

MODEL = "parcel_eta"
OUTPUTS = ("eta_prediction", "confidence_score")


class FakeTriton:
    """A Triton that loads whatever the CPU mirror's policy lists, except the versions it is told to refuse."""

    def __init__(self, settings: Settings, *, refuses: tuple[int, ...] = ()) -> None:
        self.settings, self.refuses, self.loads = settings, refuses, 0
        self.ready: dict[str, set[int]] = {}  # by model: one server serves every model of the repository
        self.url = "http://triton.test:8000"

    def __call__(self, url: str, timeout: float = 10) -> FakeTriton:
        return self

    def version_ready(self, model: str, version: int) -> bool:
        return version in self.ready.get(model, set())

    def load(self, model: str, config=None) -> None:
        from mlrelease.serving.local_triton import TritonPaths

        self.loads += 1
        mirror = TritonPaths.from_settings(self.settings).cpu_repository / model / "config.pbtxt"
        offered = list(parse_pbtxt(mirror.read_text()).version_policy.specific.versions)
        self.ready[model] = {v for v in offered if v not in self.refuses}
        refused = [v for v in offered if v in self.refuses]
        if refused:
            raise StepError(f"failed to load '{model}' version {refused[0]}: bad graph\n\nAt:\n  model.py(12): init\n")

    def wait_ready(self, model: str, version: int, timeout_s: float = 60.0) -> None:
        if not self.version_ready(model, version):
            raise StepError(f"{model} version {version} not ready after {timeout_s:.0f} s")

    def close(self) -> None:
        pass


@pytest.fixture
def settings(tmp_path, monkeypatch) -> Settings:
    monkeypatch.setenv("MLRELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLRELEASE_TRITON_URL", raising=False)
    built = Settings.from_env()
    root = model_repository(built)
    for version in (1, 2, 3):
        write_version(root, MODEL, version, f"model-{version}".encode(), {})
    write_config(root, build_config(MODEL, 14, OUTPUTS, [1, 2, 3], ServingConfig()))
    return built


def _triton(monkeypatch, settings: Settings, **kwargs) -> FakeTriton:
    fake = FakeTriton(settings, **kwargs)
    monkeypatch.setattr(reconcile, "TritonClient", fake)
    return fake


def test_a_swapped_file_refuses_that_version_only_and_names_its_digest(settings, monkeypatch):
    fake = _triton(monkeypatch, settings)
    (model_repository(settings) / MODEL / "2" / "model.onnx").write_bytes(b"other bytes")
    result = reconcile.reconcile(settings, fake.url)
    assert result["declared"] == [1, 2, 3] and result["serving"] == [1, 3] and result["reloaded"] == [1, 3]
    assert result["status"] == "refused some" and list(result["refused"]) == ["2"]
    assert "has sha256" in result["refused"]["2"] and "not the file that was checked" in result["refused"]["2"]
    (line,) = reconcile.refusal_lines({MODEL: result})
    assert line.startswith("parcel_eta v2 is declared but not served: v2 model.onnx at ")
    # the file that is not the one checked was never offered to the server
    assert not (endpoint.TritonPaths.from_settings(settings).cpu_repository / MODEL / "2").exists()
    again = reconcile.reconcile(settings, fake.url)  # nothing missing but the refused one: no reload
    assert (again["status"], again["reloaded"], fake.loads) == ("refused some", [], 1)


def test_a_version_triton_refuses_is_named_with_triton_s_reason_in_one_line(settings, monkeypatch):
    fake = _triton(monkeypatch, settings, refuses=(3,))
    result = reconcile.reconcile(settings, fake.url)
    assert result["serving"] == [1, 2] and list(result["refused"]) == ["3"]
    assert result["refused"]["3"] == (
        f"Triton at {fake.url} refused it: failed to load 'parcel_eta' version 3: bad graph"
    )


def test_ensure_ready_fails_naming_the_reason_when_the_wanted_version_is_refused(settings, monkeypatch):
    fake = _triton(monkeypatch, settings)
    (model_repository(settings) / MODEL / "1" / "model.onnx").write_bytes(b"other bytes")
    with pytest.raises(StepError, match=r"version\(s\) \[1\] cannot be served .*v1: v1 model.onnx at .* sha256"):
        reconcile.ensure_ready(settings, fake.url, [1])
    reconcile.ensure_ready(settings, fake.url, [2, 3])  # the others are served: no error
    assert fake.ready == {MODEL: {2, 3}}


def test_nothing_declared_is_in_sync_with_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("MLRELEASE_HOME", str(tmp_path / "empty"))
    result = reconcile.reconcile(Settings.from_env(), "http://unused:8000")
    assert result == {"declared": [], "serving": [], "reloaded": [], "refused": {}, "status": "nothing declared"}


def test_one_triton_serves_every_model_and_a_bad_version_of_one_leaves_the_other_alone(settings, monkeypatch):
    fake = _triton(monkeypatch, settings)
    root = model_repository(settings)
    for version in (1, 2):
        write_version(root, "late_delivery", version, f"late-{version}".encode(), {})
    write_config(root, build_config("late_delivery", 10, ("is_late", "late_probability"), [1, 2], ServingConfig()))
    (root / "late_delivery" / "2" / "model.onnx").write_bytes(b"other bytes")
    results = reconcile.reconcile_all(settings, fake.url)
    assert list(results) == ["late_delivery", MODEL]
    assert results[MODEL]["serving"] == [1, 2, 3] and results[MODEL]["status"] == "reloaded"
    assert results["late_delivery"]["serving"] == [1] and list(results["late_delivery"]["refused"]) == ["2"]
    assert fake.ready == {MODEL: {1, 2, 3}, "late_delivery": {1}}
    (line,) = reconcile.refusal_lines(results)
    assert line.startswith("late_delivery v2 is declared but not served: v2 model.onnx at ")
    assert reconcile.declared_versions(settings, "late_delivery") == [1, 2]

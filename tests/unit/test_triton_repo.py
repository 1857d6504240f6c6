"""The Triton repository: config from Triton's schema, immutable versions, and the CPU translation."""

from __future__ import annotations

import os

import pytest

from mlrelease.serving.cpu_repo import cpu_config, sync_cpu_repository
from mlrelease.serving.triton_repo import (
    ServingConfig,
    build_config,
    parse_pbtxt,
    read_metadata,
    sha256,
    to_pbtxt,
    versions_present,
    write_config,
    write_version,
)

OUTPUTS = ("eta_prediction", "confidence_score")


def _config(versions=(1, 2)):
    return build_config("parcel_eta", 14, OUTPUTS, list(versions), ServingConfig())


def test_production_config_is_onnxruntime_on_gpu_with_batching_and_both_versions():
    text = to_pbtxt(_config())
    assert 'platform: "onnxruntime_onnx"' in text and "kind: KIND_GPU" in text
    assert "max_queue_delay_microseconds: 500" in text and "max_batch_size: 256" in text
    parsed = parse_pbtxt(text)
    assert list(parsed.version_policy.specific.versions) == [1, 2]
    assert [i.name for i in parsed.input] == ["features"] and list(parsed.input[0].dims) == [14]
    assert [o.name for o in parsed.output] == list(OUTPUTS)
    with pytest.raises(ValueError, match="at least one version"):
        build_config("parcel_eta", 14, OUTPUTS, [], ServingConfig())


def test_cpu_translation_changes_only_backend_and_instances():
    production = _config()
    cpu = cpu_config(production)
    assert cpu.backend == "python" and cpu.platform == ""
    assert [g.kind for g in cpu.instance_group] == [cpu.instance_group[0].KIND_CPU]
    for field in ("name", "max_batch_size", "input", "output", "dynamic_batching", "version_policy"):
        assert getattr(cpu, field) == getattr(production, field), field
    assert production.platform == "onnxruntime_onnx"  # the production config is not touched


def test_versions_are_published_once_and_atomically(tmp_path):
    assert write_version(tmp_path, "parcel_eta", 3, b"onnx-bytes", {"mlflow_run_id": "r1"}) is True
    meta = read_metadata(tmp_path, "parcel_eta", 3)
    assert meta["version"] == 3 and meta["sha256"] == sha256(tmp_path / "parcel_eta/3/model.onnx")
    before = (tmp_path / "parcel_eta/3/model.onnx").stat().st_mtime_ns
    assert write_version(tmp_path, "parcel_eta", 3, b"other-bytes", {}) is False
    assert (tmp_path / "parcel_eta/3/model.onnx").read_bytes() == b"onnx-bytes"
    assert (tmp_path / "parcel_eta/3/model.onnx").stat().st_mtime_ns == before
    assert versions_present(tmp_path, "parcel_eta") == [3]
    assert not [p for p in (tmp_path / "parcel_eta").iterdir() if p.name.startswith(".")]
    with pytest.raises(FileNotFoundError, match="version 4 is not in the repository"):
        read_metadata(tmp_path, "parcel_eta", 4)


def test_failed_write_leaves_no_version(tmp_path, monkeypatch):
    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "rename", boom)
    with pytest.raises(OSError, match="disk full"):
        write_version(tmp_path, "parcel_eta", 1, b"x", {})
    assert versions_present(tmp_path, "parcel_eta") == []
    assert list((tmp_path / "parcel_eta").iterdir()) == []


def test_cpu_repository_mirror(tmp_path):
    prod, cpu = tmp_path / "prod", tmp_path / "cpu"
    write_version(prod, "parcel_eta", 1, b"model-one", {})
    write_config(prod, _config([1]))
    prod_config_before = (prod / "parcel_eta/config.pbtxt").read_text()
    assert sync_cpu_repository(prod, cpu, "parcel_eta") == [1]
    assert (cpu / "parcel_eta/1/model.onnx").read_bytes() == b"model-one"
    assert "class TritonPythonModel" in (cpu / "parcel_eta/1/model.py").read_text()
    assert parse_pbtxt((cpu / "parcel_eta/config.pbtxt").read_text()).backend == "python"
    assert (prod / "parcel_eta/config.pbtxt").read_text() == prod_config_before
    assert sorted(p.name for p in (prod / "parcel_eta/1").iterdir()) == ["model.onnx", "model_config.json"]

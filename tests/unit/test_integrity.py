"""The served model is the checked model: byte integrity and the graph contract, without Triton or MLflow."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from mlrelease.errors import GateFailed, StepError
from mlrelease.model.estimator import EtaModel
from mlrelease.model.features import FEATURES
from mlrelease.model.onnx_export import OUTPUTS, to_onnx
from mlrelease.serving.integrity import graph_problems, verify_policy, verify_version
from mlrelease.serving.triton_repo import ServingConfig, build_config, write_config, write_version
from mlrelease.steps.validate_serving import output_problems
from mlrelease.storage import sha256

MODEL = "parcel_eta"


# --- bad graphs, built by editing a real exported graph (shared with the integration tests) -----------------


def wide_eta(model_bytes: bytes) -> bytes:
    """The graph with eta_prediction computed and declared as [N, 2] (the eta column twice): valid, wrong shape."""
    import onnx
    from onnx import helper

    model = onnx.load_from_string(model_bytes)
    graph = model.graph
    for node in graph.node:  # whatever produced or read eta_prediction now uses an internal name
        node.output[:] = ["eta_single" if n == "eta_prediction" else n for n in node.output]
        node.input[:] = ["eta_single" if n == "eta_prediction" else n for n in node.input]
    graph.node.append(helper.make_node("Concat", ["eta_single", "eta_single"], ["eta_prediction"], axis=1))
    eta = next(o for o in graph.output if o.name == "eta_prediction")
    eta.type.tensor_type.shape.dim[1].dim_value = 2
    onnx.checker.check_model(model, full_check=True)  # a graph any ONNX tool accepts: only the contract refuses it
    return bytes(model.SerializeToString())


def without_output(model_bytes: bytes, name: str) -> bytes:
    """The graph with one declared output removed (its nodes stay, unused): valid, but not what the config serves."""
    import onnx

    model = onnx.load_from_string(model_bytes)
    kept = [o for o in model.graph.output if o.name != name]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    onnx.checker.check_model(model, full_check=True)
    return bytes(model.SerializeToString())


@pytest.fixture(scope="module")
def good() -> bytes:
    """A tiny real model's ONNX bytes."""
    rng = np.random.default_rng(0)
    return to_onnx(EtaModel(max_iter=5).fit(rng.random((300, len(FEATURES))), rng.random(300)))


def _config(versions: list[int] | None = None):
    return build_config(MODEL, len(FEATURES), OUTPUTS, versions or [1], ServingConfig())


# --- verify_version ---------------------------------------------------------------------------------------


def test_a_published_version_verifies_to_its_digest(tmp_path):
    write_version(tmp_path, MODEL, 3, b"onnx-bytes", {})
    meta = json.loads((tmp_path / MODEL / "3/model_config.json").read_text())
    assert meta["size"] == len(b"onnx-bytes")
    assert verify_version(tmp_path, 3) == meta["sha256"] == sha256(tmp_path / MODEL / "3/model.onnx")


def test_swapped_bytes_are_refused_naming_both_digests(tmp_path):
    write_version(tmp_path, MODEL, 2, b"checked-bytes", {})
    recorded = json.loads((tmp_path / MODEL / "2/model_config.json").read_text())["sha256"]
    path = tmp_path / MODEL / "2/model.onnx"
    path.write_bytes(b"other bytes, longer")
    with pytest.raises(GateFailed) as refused:
        verify_version(tmp_path, 2)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"v2 model.onnx at {path} has sha256 ")
    assert sha256(path)[:12] in message and recorded[:12] in message
    assert "(19 bytes) on disk, export recorded" in message and "(13 bytes)" in message
    assert message.endswith("the file that would be served is not the file that was checked")


def test_a_record_without_size_still_verifies_by_digest(tmp_path):
    write_version(tmp_path, MODEL, 1, b"old", {})
    meta_file = tmp_path / MODEL / "1/model_config.json"
    meta = json.loads(meta_file.read_text())
    del meta["size"]  # written before sizes were recorded
    meta_file.write_text(json.dumps(meta))
    assert verify_version(tmp_path, 1) == meta["sha256"]
    (tmp_path / MODEL / "1/model.onnx").write_bytes(b"new")
    with pytest.raises(GateFailed, match=r"export recorded [0-9a-f]{12}… \(size not recorded\)"):
        verify_version(tmp_path, 1)


@pytest.mark.parametrize("missing", ["model.onnx", "model_config.json", "sha256"])
def test_missing_file_or_record_is_a_step_error_naming_it(tmp_path, missing):
    write_version(tmp_path, MODEL, 4, b"bytes", {})
    directory = tmp_path / MODEL / "4"
    if missing == "sha256":
        (directory / "model_config.json").write_text(json.dumps({"version": 4}))
    else:
        (directory / missing).unlink()
    with pytest.raises(StepError) as failed:
        verify_version(tmp_path, 4)
    assert type(failed.value) is StepError  # exit 2: nothing was judged, re-export and retry
    assert missing in str(failed.value) and "v4" in str(failed.value)


class _Tags:
    """A registry stand-in: only the version tags verify_version reads."""

    def __init__(self, tags: dict[str, str]) -> None:
        self.tags = tags

    def version_tags(self, version: int) -> dict[str, str]:
        return self.tags


def test_the_registry_tag_catches_a_file_rewritten_with_its_record(tmp_path):
    write_version(tmp_path, MODEL, 5, b"checked", {})
    checked = verify_version(tmp_path, 5)
    assert verify_version(tmp_path, 5, registry=_Tags({"onnx_sha256": checked})) == checked  # type: ignore[arg-type]
    assert verify_version(tmp_path, 5, registry=_Tags({})) == checked  # type: ignore[arg-type]  # export not done
    with pytest.raises(GateFailed, match=f"the registry's onnx_sha256 tag records {'0' * 12}…"):
        verify_version(tmp_path, 5, registry=_Tags({"onnx_sha256": "0" * 64}))  # type: ignore[arg-type]


def test_every_version_in_the_policy_is_verified(tmp_path):
    write_version(tmp_path, MODEL, 1, b"one", {})
    write_version(tmp_path, MODEL, 2, b"two", {})
    write_config(tmp_path, _config([1, 2]))
    assert set(verify_policy(tmp_path)) == {1, 2}
    (tmp_path / MODEL / "2/model.onnx").write_bytes(b"three")
    with pytest.raises(GateFailed, match="^v2 model.onnx"):
        verify_policy(tmp_path)


# --- the graph against the config -------------------------------------------------------------------------


def test_the_exported_graph_meets_the_contract(good):
    assert graph_problems(good, _config()) == []


def test_a_wide_output_is_named_with_expected_and_found(good):
    assert graph_problems(wide_eta(good), _config()) == [
        "output eta_prediction: expected FP32 [-1, 1], found FP32 [-1, 2]"
    ]


def test_a_missing_output_is_named(good):
    assert graph_problems(without_output(good, "confidence_score"), _config()) == [
        "output confidence_score: expected FP32 [-1, 1], found no such graph output"
    ]


def test_a_wider_input_and_garbage_are_named(good):
    from mlrelease_drills.faults import faulty_model

    n = len(FEATURES)
    assert graph_problems(faulty_model(good, "error"), _config()) == [
        f"input features: expected FP32 [-1, {n}], found FP32 [-1, {n + 1}]"
    ]
    (problem,) = graph_problems(good[:2000], _config())
    assert problem.startswith("not a readable ONNX model") or "refused the graph" in problem
    assert "\n" not in problem


def test_a_declared_shape_the_graph_does_not_compute_is_refused_by_strict_inference(good):
    import onnx

    model = onnx.load_from_string(good)
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 2  # declared [N, 2], computed [N, 1]
    (problem,) = graph_problems(model.SerializeToString(), _config())
    assert "refused the graph" in problem and "\n" not in problem


def test_the_drill_faults_still_meet_the_contract(good):
    # An export rerun re-checks the published bytes, drill versions included: they must stay servable.
    from mlrelease_drills.faults import CANDIDATE_DRILLS, drill_candidate, faulty_model

    for drill in sorted(set(CANDIDATE_DRILLS) - {"slow"}):
        assert graph_problems(drill_candidate(good, drill), _config()) == [], drill
    assert graph_problems(faulty_model(good, "slow", factor=2), _config()) == []


# --- validate-serving's check of a real answer ------------------------------------------------------------


REPORTED = {"output": [{"name": n, "data_type": "TYPE_FP32", "dims": ["1"]} for n in OUTPUTS]}


def test_answers_must_have_the_declared_shape_and_type():
    rows = 4
    ok = {n: np.zeros((rows, 1), np.float32) for n in OUTPUTS}
    assert output_problems(ok, rows, REPORTED) == []
    wide = {**ok, "eta_prediction": np.zeros((rows, 2), np.float32)}
    assert output_problems(wide, rows, REPORTED) == [
        "output eta_prediction has shape [4, 2] float32 for 4 rows, the config declares [4, 1] TYPE_FP32"
    ]
    doubles = {**ok, "confidence_score": np.zeros((rows, 1), np.float64)}
    assert output_problems(doubles, rows, REPORTED) == [
        "output confidence_score has shape [4, 1] float64 for 4 rows, the config declares [4, 1] TYPE_FP32"
    ]
    flat = {**ok, "confidence_score": np.zeros(rows, np.float32)}
    assert "output confidence_score has shape [4]" in output_problems(flat, rows, REPORTED)[0]
    assert output_problems({"eta_prediction": ok["eta_prediction"]}, rows, REPORTED) == [
        "output confidence_score is missing from the answer"
    ]


# --- the CPU server's model.py, run without Triton --------------------------------------------------------


@pytest.fixture
def python_model(monkeypatch):
    """The model.py module, imported with a stand-in for triton_python_backend_utils (only Triton's stub has it)."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    path = Path(__file__).parents[2] / "src/mlrelease/serving/onnx_python_model.py"
    spec = importlib.util.spec_from_file_location("onnx_python_model_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _initialize(module, tmp_path: Path, model_bytes: bytes, served: bytes | None = None):
    """Run TritonPythonModel.initialize on a version directory as Triton lays it out (record of `model_bytes`)."""
    from google.protobuf import json_format

    write_version(tmp_path, MODEL, 1, model_bytes, {})
    if served is not None:
        (tmp_path / MODEL / "1/model.onnx").write_bytes(served)
    config = json_format.MessageToDict(_config(), preserving_proto_field_name=True)
    model = module.TritonPythonModel()
    args = {"model_config": json.dumps(config), "model_repository": str(tmp_path / MODEL), "model_version": "1"}
    model.initialize(args)
    return model


def test_model_py_serves_the_recorded_file(python_model, tmp_path, good):
    model = _initialize(python_model, tmp_path, good)
    assert model.output_names == list(OUTPUTS)


def test_model_py_refuses_swapped_bytes(python_model, tmp_path, good):
    other = to_onnx(EtaModel(max_iter=3).fit(np.ones((50, len(FEATURES))), np.arange(50.0)))
    with pytest.raises(RuntimeError, match=r"has sha256 [0-9a-f]{12}… \(\d+ bytes\) on disk, export recorded"):
        _initialize(python_model, tmp_path, good, served=other)


@pytest.mark.parametrize(
    ("edit", "found"),
    [
        (wide_eta, "output eta_prediction: expected FP32 [-1, 1], found FP32 [-1, 2]"),
        (
            lambda b: without_output(b, "confidence_score"),
            "output confidence_score: expected FP32 [-1, 1], found no such graph output",
        ),
    ],
    ids=["eta_prediction [N, 2]", "no confidence_score"],
)
def test_model_py_refuses_a_graph_that_is_not_the_config(python_model, tmp_path, good, edit, found):
    with pytest.raises(RuntimeError, match="v1 graph does not match the config") as refused:
        _initialize(python_model, tmp_path, edit(good))
    assert found in str(refused.value)


def test_triton_refusals_lose_the_stub_traceback_but_keep_every_reason():
    from mlrelease.serving.triton_client import one_line_reason as _one_line

    refused = (
        "load failed for model 'parcel_eta': version 2 is at UNAVAILABLE state: Internal: RuntimeError: v2 bad\n\n"
        "At:\n  /r/parcel_eta/2/model.py(45): _verified_bytes\n  /r/parcel_eta/2/model.py(83): initialize\n;\n"
        "version 3 is at UNAVAILABLE state: Internal: RuntimeError: v3 bad\n\nAt:\n  /r/model.py(83): initialize\n"
    )
    assert _one_line(refused) == (
        "load failed for model 'parcel_eta': version 2 is at UNAVAILABLE state: Internal: RuntimeError: v2 bad ; "
        "version 3 is at UNAVAILABLE state: Internal: RuntimeError: v3 bad"
    )

"""Deliberately faulty model versions: the same ONNX graph, broken in exactly the named way."""

from __future__ import annotations

import numpy as np
import pytest

from mlrelease.model.estimator import EtaModel
from mlrelease.model.features import FEATURES, encode
from mlrelease.model.onnx_export import run_onnx, to_onnx
from mlrelease_drills.devkit import training_frame
from mlrelease_drills.faults import FAULT_KINDS, faulty_model

REMOTE = FEATURES.index("is_remote")
BULKY = FEATURES.index("is_bulky")
WEIGHT = FEATURES.index("weight_kg")


@pytest.fixture(scope="module")
def sample() -> tuple[bytes, np.ndarray]:
    """A tiny model's ONNX bytes and 300 rows whose 0/1 columns are mixed."""
    rng = np.random.default_rng(3)
    X = rng.uniform(0, 10, size=(300, len(FEATURES))).astype("float32")
    X[:, REMOTE] = rng.integers(0, 2, size=300)
    X[:, BULKY] = rng.integers(0, 2, size=300)
    y = 10 + 2 * X[:, 1] + 5 * X[:, REMOTE] + rng.normal(0, 1, 300)
    model = EtaModel(max_iter=10).fit(X, y)
    return to_onnx(model), X


def test_baseline_is_finite(sample):
    model_bytes, X = sample
    eta, confidence = run_onnx(model_bytes, X)
    assert eta.shape == confidence.shape == (len(X),)
    assert np.isfinite(eta).all() and np.isfinite(confidence).all()


def test_nan_everywhere_keeps_confidence(sample):
    model_bytes, X = sample
    _, confidence = run_onnx(model_bytes, X)
    broken = faulty_model(model_bytes, "nan")
    assert broken != model_bytes
    eta_f, confidence_f = run_onnx(broken, X)
    assert eta_f.shape == (len(X),)
    assert np.isnan(eta_f).all()
    np.testing.assert_array_equal(confidence_f, confidence)


def test_nan_only_where_remote(sample):
    model_bytes, X = sample
    eta, confidence = run_onnx(model_bytes, X)
    eta_f, confidence_f = run_onnx(faulty_model(model_bytes, "nan", only_where="is_remote"), X)
    remote = X[:, REMOTE] == 1
    assert 0 < remote.sum() < len(X)  # both kinds of rows are present
    np.testing.assert_array_equal(np.isnan(eta_f), remote)
    np.testing.assert_array_equal(eta_f[~remote], eta[~remote])  # the other rows are untouched
    np.testing.assert_array_equal(confidence_f, confidence)


def test_nan_only_where_follows_the_named_column(sample):
    model_bytes, X = sample
    eta_f, _ = run_onnx(faulty_model(model_bytes, "nan", only_where="is_bulky"), X)
    np.testing.assert_array_equal(np.isnan(eta_f), X[:, BULKY] == 1)
    assert not np.array_equal(X[:, BULKY], X[:, REMOTE])  # so the test tells the two columns apart


def test_error_fault_fails_at_inference(sample):
    model_bytes, X = sample
    broken = faulty_model(model_bytes, "error")
    with pytest.raises(Exception, match=r"(?i)(dimension|shape|invalid)"):
        run_onnx(broken, X[:5])
    # the graph now wants one more column than the model's features; given it, the answers are unchanged
    wider = np.hstack([X[:5], np.zeros((5, 1), dtype=np.float32)])
    eta_w, confidence_w = run_onnx(broken, wider)
    eta, confidence = run_onnx(model_bytes, X[:5])
    np.testing.assert_array_equal(eta_w, eta)
    np.testing.assert_array_equal(confidence_w, confidence)


def test_nan_and_above_breaks_only_rows_meeting_both(sample):
    model_bytes, X = sample
    eta, confidence = run_onnx(model_bytes, X)
    broken = faulty_model(model_bytes, "nan", only_where="is_remote", and_above=("weight_kg", 7.0))
    eta_f, confidence_f = run_onnx(broken, X)
    hit = (X[:, REMOTE] == 1) & (X[:, WEIGHT] > 7.0)
    assert 0 < hit.sum() < (X[:, REMOTE] == 1).sum()  # a strict subset of the remote rows
    np.testing.assert_array_equal(np.isnan(eta_f), hit)
    np.testing.assert_array_equal(eta_f[~hit], eta[~hit])
    np.testing.assert_array_equal(confidence_f, confidence)


def test_nan_and_above_alone_and_nan_features_never_select(sample):
    model_bytes, X = sample
    X = X.copy()
    X[:10, WEIGHT] = np.nan  # a missing weight is not "above" anything
    eta_f, _ = run_onnx(faulty_model(model_bytes, "nan", and_above=("weight_kg", 5.0)), X)
    np.testing.assert_array_equal(np.isnan(eta_f), X[:, WEIGHT] > 5.0)
    assert not np.isnan(eta_f[:10]).any()


def test_nan_on_a_few_percent_of_the_long_tail(sample, clean_offline):
    """The drill's "NaN on a few % of long-tail requests": remote routes and parcels over 10 kg."""
    model_bytes, _ = sample
    frame = training_frame(clean_offline)
    X = encode(frame[list(FEATURES)])
    eta_f, _ = run_onnx(faulty_model(model_bytes, "nan", only_where="is_remote", and_above=("weight_kg", 10.0)), X)
    hit = frame["is_remote"].to_numpy() & (frame["weight_kg"].to_numpy() > 10.0)
    np.testing.assert_array_equal(np.isnan(eta_f), hit)
    # the gateway's cohorts, in rule order: high_value first, then long_tail
    high_value = (frame["tier"] == "premium") | (frame["declared_value"] >= 1000)
    long_tail = ~high_value & (
        frame["is_remote"] | frame["is_bulky"] | frame["category"].isin(["furniture", "perishables"])
    )
    share = (hit & long_tail).sum() / long_tail.sum()
    print(f"NaN on {share:.1%} of long_tail rows, {hit.mean():.1%} of all rows ({hit.sum()} of {len(hit)})")
    assert 0.01 < share < 0.10


def test_scale_confidence_only_where_remote(sample):
    model_bytes, X = sample
    eta, confidence = run_onnx(model_bytes, X)
    broken = faulty_model(model_bytes, "scale", output="confidence_score", factor=0.5, only_where="is_remote")
    eta_f, confidence_f = run_onnx(broken, X)
    remote = X[:, REMOTE] == 1
    np.testing.assert_array_equal(confidence_f[remote], confidence[remote] * np.float32(0.5))
    np.testing.assert_array_equal(confidence_f[~remote], confidence[~remote])
    np.testing.assert_array_equal(eta_f, eta)


def test_scale_eta_on_rows_meeting_both_conditions(sample):
    model_bytes, X = sample
    eta, confidence = run_onnx(model_bytes, X)
    broken = faulty_model(
        model_bytes, "scale", output="eta_prediction", factor=1.5, only_where="is_bulky", and_above=("weight_kg", 3.0)
    )
    eta_f, confidence_f = run_onnx(broken, X)
    hit = (X[:, BULKY] == 1) & (X[:, WEIGHT] > 3.0)
    assert 0 < hit.sum() < len(X)
    np.testing.assert_array_equal(eta_f[hit], eta[hit] * np.float32(1.5))
    np.testing.assert_array_equal(eta_f[~hit], eta[~hit])
    np.testing.assert_array_equal(confidence_f, confidence)


def test_scale_everywhere_keeps_confidence_a_probability(sample):
    model_bytes, X = sample
    eta, confidence = run_onnx(model_bytes, X)
    eta_f, confidence_f = run_onnx(faulty_model(model_bytes, "scale", output="confidence_score", factor=3.0), X)
    np.testing.assert_array_equal(confidence_f, np.minimum(confidence * np.float32(3.0), 1))
    assert (confidence_f <= 1).all() and (confidence_f == 1).any()  # some rows were clipped
    np.testing.assert_array_equal(eta_f, eta)


def test_slow_gives_the_same_answers(sample):
    model_bytes, X = sample
    broken = faulty_model(model_bytes, "slow", factor=2.0)
    assert broken != model_bytes
    odd = X[:4].copy()
    odd[0, 1], odd[1, 2], odd[2, :] = np.nan, np.inf, -np.inf  # the busy work meets NaN and inf too
    for rows in (X, X[:1], odd):
        for good, slow in zip(run_onnx(model_bytes, rows), run_onnx(broken, rows), strict=True):
            np.testing.assert_array_equal(slow, good)


def test_batch_cost_gives_the_same_answers(sample):
    model_bytes, X = sample
    broken = faulty_model(model_bytes, "batch_cost", factor=3.0)
    assert broken != model_bytes
    odd = X[:4].copy()
    odd[0, 1], odd[1, 2], odd[2, :] = np.nan, np.inf, -np.inf  # the Gram matrix meets NaN and inf too
    for rows in (X, X[:1], X[:16], odd):
        for good, costly in zip(run_onnx(model_bytes, rows), run_onnx(broken, rows), strict=True):
            np.testing.assert_array_equal(costly, good)


def _gram_side(model_bytes: bytes, rows: int) -> int:
    """The side of the batch_cost fault's Gram matrix for a batch of `rows` rows (exposed as an extra output)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load_from_string(model_bytes)
    model.graph.output.append(onnx.helper.make_empty_tensor_value_info("fault_gram"))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (gram,) = session.run(["fault_gram"], {"features": np.zeros((rows, len(FEATURES)), dtype=np.float32)})
    assert gram.shape[0] == gram.shape[1]
    return int(gram.shape[0])


def test_batch_cost_work_grows_with_the_square_of_the_batch_up_to_a_cap(sample):
    model_bytes, _ = sample
    broken = faulty_model(model_bytes, "batch_cost")  # the drill's default: a batch of 16 costs ~20x one row
    tiles = _gram_side(broken, 1)
    assert tiles > 1  # sized up: the good model's own batch of 16 costs only ~2x its single row
    # A MatMul of an [n, w] matrix by its transpose costs n^2 w: 16 rows do 256x the work of one.
    assert _gram_side(broken, 16) == 16 * tiles
    assert _gram_side(broken, 3000) == 64 * tiles  # rows past the 64th add no work: memory stays bounded


def test_fault_kinds():
    assert FAULT_KINDS == ("nan", "error", "slow", "scale", "batch_cost")


@pytest.mark.parametrize(
    ("kind", "options", "message"),
    [
        ("sluggish", {}, r"unknown fault kind 'sluggish'"),
        ("nan", {"only_where": "shoe_size"}, r"only_where must be a model feature, got 'shoe_size'"),
        ("nan", {"factor": 2.0}, r"fault kind 'nan' takes no factor"),
        ("error", {"only_where": "is_remote"}, r"fault kind 'error' takes no only_where"),
        ("slow", {"output": "eta_prediction", "and_above": ("weight_kg", 1.0)}, r"'slow' takes no and_above, output"),
        ("nan", {"and_above": ("shoe_size", 1.0)}, r"and_above must name a model feature, got 'shoe_size'"),
        ("nan", {"and_above": "weight_kg"}, r"and_above must be a \(feature, threshold\) pair"),
        ("nan", {"and_above": ("weight_kg", float("nan"))}, r"and_above threshold must be a finite number"),
        ("nan", {"and_above": ("weight_kg", "10")}, r"and_above threshold must be a finite number"),
        ("scale", {"factor": 0.5}, r"scale needs output, one of \('eta_prediction', 'confidence_score'\); got None"),
        ("scale", {"output": "eta", "factor": 0.5}, r"scale needs output.*got 'eta'"),
        ("scale", {"output": "eta_prediction"}, r"scale needs a finite factor > 0, got None"),
        ("scale", {"output": "eta_prediction", "factor": 0.0}, r"scale needs a finite factor > 0, got 0.0"),
        ("scale", {"output": "eta_prediction", "factor": float("inf")}, r"scale needs a finite factor > 0, got inf"),
        ("slow", {"factor": 1.0}, r"slow needs a factor in \(1, 1000\], got 1.0"),
        ("slow", {"factor": 5000}, r"slow needs a factor in \(1, 1000\], got 5000"),
        ("slow", {"factor": "3"}, r"slow needs a factor in \(1, 1000\], got '3'"),
        ("batch_cost", {"factor": 1.0}, r"batch_cost needs a factor in \(1, 50\], got 1.0"),
        ("batch_cost", {"factor": 100}, r"batch_cost needs a factor in \(1, 50\], got 100"),
        ("batch_cost", {"output": "eta_prediction"}, r"fault kind 'batch_cost' takes no output"),
    ],
)
def test_bad_arguments_are_refused(sample, kind, options, message):
    model_bytes, _ = sample
    with pytest.raises(ValueError, match=message):
        faulty_model(model_bytes, kind, **options)


# ---- the export step's drill hook (`make run CANDIDATE_FAULT=…`), the one place mlrelease imports the drills ---


class _Registry:
    """What the hook asks of the registry: the champion's version, and a place for the `drill_fault` tag."""

    def __init__(self, champion: int | None) -> None:
        self.champion, self.tags = champion, {}

    def alias_version(self, alias: str) -> int | None:
        return self.champion

    def tag_version(self, version: int, **tags: str) -> None:
        self.tags.update(tags)


def test_the_drill_hook_leaves_the_candidate_alone_without_the_variable(monkeypatch):
    from mlrelease.steps.export import DRILL_ENV, _drill

    monkeypatch.delenv(DRILL_ENV, raising=False)
    registry = _Registry(champion=1)
    assert _drill(registry, 2, b"graph") == b"graph" and registry.tags == {}
    monkeypatch.setenv(DRILL_ENV, "slow")
    assert _drill(_Registry(champion=None), 1, b"graph") == b"graph"  # a first champion


def test_the_drill_hook_injects_the_named_fault_and_tags_the_version(monkeypatch):
    from mlrelease.steps.export import DRILL_ENV, _drill
    from mlrelease_drills import faults

    monkeypatch.setenv(DRILL_ENV, "slow")
    monkeypatch.setattr(faults, "drill_candidate", lambda model_bytes, drill: model_bytes + drill.encode())
    registry = _Registry(champion=1)
    assert _drill(registry, 2, b"graph") == b"graphslow"
    assert registry.tags == {"drill_fault": "slow"}


def test_the_drill_hook_names_the_variable_for_an_unknown_drill(monkeypatch):
    from mlrelease.errors import StepError
    from mlrelease.steps.export import DRILL_ENV, _drill

    monkeypatch.setenv(DRILL_ENV, "no_such_drill")
    with pytest.raises(StepError, match=f"{DRILL_ENV}: unknown candidate drill 'no_such_drill'"):
        _drill(_Registry(champion=1), 2, b"graph")


def test_the_drill_hook_says_so_when_the_drills_package_is_missing(monkeypatch):
    import sys

    from mlrelease.errors import StepError
    from mlrelease.steps.export import DRILL_ENV, _drill

    monkeypatch.setenv(DRILL_ENV, "slow")
    monkeypatch.setitem(sys.modules, "mlrelease_drills.faults", None)  # as if the package were not installed
    with pytest.raises(StepError, match=f"{DRILL_ENV} is set, but the drills package mlrelease_drills"):
        _drill(_Registry(champion=1), 2, b"graph")

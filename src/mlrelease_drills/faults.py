"""Deliberately faulty model versions for drills and tests: the same ONNX graph, broken in one named way.

Kinds:
- `nan`: eta_prediction becomes NaN on the selected rows (see below);
- `error`: the graph demands one more input column than the config declares, so every inference is
  refused by the runtime inside Triton (a crash-like hard error per request);
- `slow`: the same answers, but an inference of one row takes about `factor` (default 3, at most 1000)
  times as long inside ONNX Runtime. eta_prediction waits on a chain of MatMuls over a matrix built from
  the input (so nothing is constant-folded), whose result only picks between eta and eta, so the answers
  are bit-for-bit those of the good model. The work is a fixed amount per call, whatever the batch size,
  sized when the fault is built by timing the slow copy against the good model with onnxruntime on the
  building machine (CPU, one row, one intra-op thread as the CPU Triton's model.py runs it): the bytes
  are not reproducible, a busy machine sizes it less precisely, and on a very fast model a factor near 1
  comes out larger. A batch of many rows (Triton's dynamic batching) is slowed by less than `factor`.
  The model itself takes ~15-40 us of a ~1 ms Triton request here, so a request through Triton is only
  visibly slower for a factor in the tens to hundreds;
- `scale`: one output (`output`: eta_prediction or confidence_score) is multiplied by `factor` (> 0) on
  the selected rows; a scaled confidence_score is clipped to [0, 1].

Rows (`nan` and `scale`): every row by default; `only_where="is_remote"` selects the rows where that 0/1
feature is set, and `and_above=("weight_kg", 10.0)` the rows where that feature is strictly above the
threshold, and `and_below=(("tier", 1.5), …)` the rows where each feature is strictly below its threshold;
given several, the rows meeting all. A NaN feature value never selects its row.
"""

from __future__ import annotations

import math
import numbers
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from mlrelease.model.features import FEATURES
from mlrelease.model.onnx_export import INPUT, OUTPUTS

if TYPE_CHECKING:
    from onnx import GraphProto, ModelProto

FAULT_KINDS = ("nan", "error", "slow", "scale")

# The optional parameters each kind accepts; passing another one is refused rather than ignored.
_PARAMETERS: dict[str, frozenset[str]] = {
    "nan": frozenset({"only_where", "and_above", "and_below"}),
    "error": frozenset(),
    "slow": frozenset({"factor"}),
    "scale": frozenset({"only_where", "and_above", "and_below", "output", "factor"}),
}
SLOW_DEFAULT_FACTOR = 3.0
SLOW_MAX_FACTOR = 1000.0
_SLOW_WIDTH = 4 * len(FEATURES)  # columns of the busy matrix: the input's column sums tiled 4 times
_SLOW_LAYERS = 2  # chained MatMuls; the matrix's row count is what the sizing chooses
_SLOW_MAX_ROWS = 1 << 17  # 29 MB per busy matrix


def faulty_model(
    model_bytes: bytes,
    kind: str,
    *,
    only_where: str | None = None,
    and_above: tuple[str, float] | None = None,
    and_below: tuple[tuple[str, float], ...] | None = None,
    output: str | None = None,
    factor: float | None = None,
) -> bytes:
    """A copy of a serialized model with the fault `kind` injected (see module docstring).

    A parameter the kind does not take, an unknown feature or output, or a factor out of range is a
    ValueError naming it.
    """
    import onnx

    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {kind!r}; choose from {FAULT_KINDS}")
    given = {
        "only_where": only_where,
        "and_above": and_above,
        "and_below": and_below,
        "output": output,
        "factor": factor,
    }
    stray = sorted(name for name, value in given.items() if value is not None and name not in _PARAMETERS[kind])
    if stray:
        raise ValueError(f"fault kind {kind!r} takes no {', '.join(stray)}")
    model = onnx.load_from_string(model_bytes)
    if kind == "nan":
        _nan_eta(model.graph, _row_mask(model.graph, only_where, and_above, and_below or ()))
    elif kind == "scale":
        mask = _row_mask(model.graph, only_where, and_above, and_below or ())
        _scale(model.graph, _scale_output(output), _scale_factor(factor), mask)
    elif kind == "slow":
        model = _slow(model, model_bytes, _slow_factor(factor))
    else:
        _wider_input(model.graph)
    onnx.checker.check_model(model, full_check=True)
    return bytes(model.SerializeToString())


# --- which rows a value fault touches ----------------------------------------------------------


def _row_mask(
    graph: GraphProto,
    only_where: str | None,
    and_above: tuple[str, float] | None,
    and_below: tuple[tuple[str, float], ...] = (),
) -> str | None:
    """The name of a bool [N, 1] tensor, true on the rows to break; None when every row is."""
    from onnx import helper

    conditions = []
    if only_where is not None:
        if only_where not in FEATURES:
            raise ValueError(f"only_where must be a model feature, got {only_where!r}")
        conditions.append(_column_above(graph, only_where, 0.5, "fault_flag"))
    if and_above is not None:
        if not (isinstance(and_above, tuple | list) and len(and_above) == 2):
            raise ValueError(f"and_above must be a (feature, threshold) pair, got {and_above!r}")
        feature, threshold = and_above
        if feature not in FEATURES:
            raise ValueError(f"and_above must name a model feature, got {feature!r}")
        if not _finite(threshold):
            raise ValueError(f"and_above threshold must be a finite number, got {threshold!r}")
        conditions.append(_column_above(graph, feature, float(threshold), "fault_above"))
    conditions += _below_conditions(graph, and_below)
    if len(conditions) < 2:
        return conditions[0] if conditions else None
    mask = conditions[0]
    for i, condition in enumerate(conditions[1:]):
        graph.node.append(helper.make_node("And", [mask, condition], [f"fault_mask{i}"]))
        mask = f"fault_mask{i}"
    return mask


def _below_conditions(graph: GraphProto, and_below: tuple[tuple[str, float], ...]) -> list[str]:
    """One `feature < threshold` mask per pair."""
    names = []
    for i, pair in enumerate(and_below):
        if not (isinstance(pair, tuple | list) and len(pair) == 2 and pair[0] in FEATURES and _finite(pair[1])):
            raise ValueError(f"and_below must hold (model feature, finite threshold) pairs, got {pair!r}")
        names.append(_column_compare(graph, pair[0], float(pair[1]), f"fault_below{i}", "Less"))
    return names


def _finite(value: object) -> bool:
    """A real, finite number (a bool is not one)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _column_above(graph: GraphProto, feature: str, threshold: float, name: str) -> str:
    """Add nodes computing `features[:, feature] > threshold` as bool [N, 1]; returns the tensor's name."""
    return _column_compare(graph, feature, threshold, name, "Greater")


def _column_compare(graph: GraphProto, feature: str, threshold: float, name: str, op: str) -> str:
    """Add nodes computing `features[:, feature] <op> threshold` (Greater or Less) as bool [N, 1]."""
    from onnx import helper, numpy_helper

    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([FEATURES.index(feature)], dtype=np.int64), f"{name}_column"),
            numpy_helper.from_array(np.array([threshold], dtype=np.float32), f"{name}_threshold"),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("Gather", [INPUT, f"{name}_column"], [f"{name}_value"], axis=1),
            helper.make_node(op, [f"{name}_value", f"{name}_threshold"], [name]),
        ]
    )
    return name


def _detach_output(graph: GraphProto, output: str) -> str:
    """Rename the graph output `output` where it is produced and read, so new nodes can produce it; the new name."""
    before = f"{output}_before_fault"
    for node in graph.node:
        node.output[:] = [before if name == output else name for name in node.output]
        node.input[:] = [before if name == output else name for name in node.input]
    return before


def _select(graph: GraphProto, output: str, mask: str | None, broken: str, before: str) -> None:
    """Produce `output` as `broken` on the masked rows (every row without a mask) and `before` elsewhere."""
    from onnx import helper

    if mask is None:
        graph.node.append(helper.make_node("Identity", [broken], [output]))
    else:
        graph.node.append(helper.make_node("Where", [mask, broken, before], [output]))


# --- the kinds ---------------------------------------------------------------------------------


def _nan_eta(graph: GraphProto, mask: str | None) -> None:
    from onnx import helper, numpy_helper

    before = _detach_output(graph, "eta_prediction")
    graph.initializer.append(numpy_helper.from_array(np.array([np.nan], dtype=np.float32), "fault_nan"))
    graph.node.append(helper.make_node("Add", [before, "fault_nan"], ["fault_broken"]))
    _select(graph, "eta_prediction", mask, "fault_broken", before)


def _scale_output(output: str | None) -> str:
    if output not in OUTPUTS:
        raise ValueError(f"scale needs output, one of {OUTPUTS}; got {output!r}")
    return output


def _scale_factor(factor: float | None) -> float:
    if factor is None or not _finite(factor) or factor <= 0:
        raise ValueError(f"scale needs a finite factor > 0, got {factor!r}")
    return float(factor)


def _scale(graph: GraphProto, output: str, factor: float, mask: str | None) -> None:
    from onnx import helper, numpy_helper

    before = _detach_output(graph, output)
    graph.initializer.append(numpy_helper.from_array(np.array([factor], dtype=np.float32), "fault_factor"))
    graph.node.append(helper.make_node("Mul", [before, "fault_factor"], ["fault_broken"]))
    broken = "fault_broken"
    if output == "confidence_score":  # a confidence stays a probability
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.array(0.0, dtype=np.float32), "fault_zero"),
                numpy_helper.from_array(np.array(1.0, dtype=np.float32), "fault_one"),
            ]
        )
        graph.node.append(helper.make_node("Clip", [broken, "fault_zero", "fault_one"], ["fault_clipped"]))
        broken = "fault_clipped"
    _select(graph, output, mask, broken, before)


def _slow_factor(factor: float | None) -> float:
    if factor is None:
        return SLOW_DEFAULT_FACTOR
    if not _finite(factor) or not 1 < factor <= SLOW_MAX_FACTOR:
        raise ValueError(f"slow needs a factor in (1, {SLOW_MAX_FACTOR:g}], got {factor!r}")
    return float(factor)


def _slow(model: ModelProto, model_bytes: bytes, factor: float) -> ModelProto:
    """A copy of `model` with busy work sized so that a batch of 1 takes about `factor` times as long.

    The busy matrix's row count climbs 1, 2, 4, ... until the slow copy is at least `factor` times as slow
    as the good model, then is interpolated between the last two steps. The least busy work (one row) is
    already some microseconds, so a factor close to 1 comes out larger than asked on a very fast model.
    """
    good = _session(model_bytes)
    rows, below = 1, (0, 1.0)
    while True:
        slow = _with_busy_work(model, rows)
        ratio = _slowdown(good, _session(slow.SerializeToString()))
        if ratio >= factor or rows >= _SLOW_MAX_ROWS:
            break
        below, rows = (rows, ratio), rows * 2
    if rows == 1 or rows >= _SLOW_MAX_ROWS:
        return slow
    fewer, fewer_ratio = below
    between = fewer + round((factor - fewer_ratio) / (ratio - fewer_ratio) * (rows - fewer))
    return slow if between == rows else _with_busy_work(model, between)


def _with_busy_work(model: ModelProto, rows: int) -> ModelProto:
    """A copy of `model` whose eta_prediction waits on `_SLOW_LAYERS` chained MatMuls of a [rows, width] matrix.

    The matrix is the input's column sums, tiled, so nothing can be folded away; the result only picks the
    condition of a Where between eta and eta, so the answers stay bit-for-bit the same whatever the input
    (a NaN or inf along the way included).
    """
    from onnx import ModelProto, helper, numpy_helper

    copy = ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    before = _detach_output(graph, "eta_prediction")
    weights = np.random.default_rng(0).standard_normal((_SLOW_WIDTH, _SLOW_WIDTH)) / math.sqrt(_SLOW_WIDTH)
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([0], dtype=np.int64), "fault_axis0"),
            numpy_helper.from_array(np.array([rows, _SLOW_WIDTH // len(FEATURES)], dtype=np.int64), "fault_tiles"),
            numpy_helper.from_array(weights.astype(np.float32), "fault_weights"),
            numpy_helper.from_array(np.array(0.0, dtype=np.float32), "fault_zero"),
        ]
    )
    nodes = [
        helper.make_node("ReduceSum", [INPUT, "fault_axis0"], ["fault_sums"], keepdims=1),
        helper.make_node("Tile", ["fault_sums", "fault_tiles"], ["fault_busy0"]),
    ]
    for layer in range(_SLOW_LAYERS):
        nodes.append(helper.make_node("MatMul", [f"fault_busy{layer}", "fault_weights"], [f"fault_busy{layer + 1}"]))
    nodes += [
        helper.make_node("ReduceSum", [f"fault_busy{_SLOW_LAYERS}"], ["fault_total"], keepdims=0),
        helper.make_node("Greater", ["fault_total", "fault_zero"], ["fault_either"]),
        helper.make_node("Where", ["fault_either", before, before], ["eta_prediction"]),
    ]
    graph.node.extend(nodes)
    return copy


def _session(model_bytes: bytes) -> Any:
    """An onnxruntime CPU session with one intra-op thread, as the CPU Triton's model.py runs a version."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def _slowdown(good: Any, slow: Any, rounds: int = 15, calls: int = 20, budget_s: float = 0.5) -> float:
    """How many times longer `slow` takes than `good` on one all-zero row: medians over interleaved rounds.

    At least 3 rounds, and fewer than `rounds` once `budget_s` is spent (a very slow copy).
    """
    feed = {INPUT: np.zeros((1, len(FEATURES)), dtype=np.float32)}

    def median_call(session: Any) -> float:
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            session.run(None, feed)
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    rounds_good: list[float] = []
    rounds_slow: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(rounds_slow) < rounds and (len(rounds_slow) < 3 or time.perf_counter() < deadline):
        rounds_good.append(median_call(good))  # interleaved, so a machine that gets busier slows both alike
        rounds_slow.append(median_call(slow))
    return float(np.median(rounds_slow) / np.median(rounds_good))


# --- error ---------------------------------------------------------------------------------------


def _wider_input(graph: GraphProto) -> None:
    from onnx import helper, numpy_helper

    width = graph.input[0].type.tensor_type.shape.dim[1]
    width.dim_value = width.dim_value + 1
    for node in graph.node:  # everything that read the input now reads its first n columns
        node.input[:] = ["features_first_n" if name == INPUT else name for name in node.input]
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([0], dtype=np.int64), "fault_start"),
            numpy_helper.from_array(np.array([len(FEATURES)], dtype=np.int64), "fault_end"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "fault_axis"),
        ]
    )
    graph.node.insert(
        0, helper.make_node("Slice", [INPUT, "fault_start", "fault_end", "fault_axis"], ["features_first_n"])
    )


# `make run CANDIDATE_FAULT=…`: a bad candidate derived from tonight's good one, to watch a gate stop it.
# Each is a fault above with its rows; the comment says which gate is expected to stop it.
NOT_HIGH_VALUE = (("tier", 1.5), ("declared_value", 1000.0))  # the gateway's high_value rule, negated
CANDIDATE_DRILLS: dict[str, dict[str, Any]] = {
    # ~400x the model's own time: ~10 ms more per request; perf_analyzer and shadow's paired test see it
    "slow": {"kind": "slow", "factor": 400},
    # NaN on remote routes: a hard failure per request; validate-serving or shadow refuse it before traffic
    "errors": {"kind": "nan", "only_where": "is_remote"},
    # confidence halved on the long tail only: shadow's served-quality check (the long tail's low-confidence
    # share vs the champion's, on the same orders) refuses it before traffic; past shadow (an override), stage
    # 2's long-tail rule (≤ 15 %) would roll that cohort back
    "low_confidence_long_tail": {
        "kind": "scale",
        "output": "confidence_score",
        "factor": 0.5,
        "only_where": "is_remote",
        "and_below": NOT_HIGH_VALUE,
    },
    # the champion's ETAs, but confidence_score 1.0 everywhere (scaled 50x, clipped): shadow's served-quality
    # calibration check refuses it before traffic (a constant confidence carries no information)
    "overconfident": {"kind": "scale", "output": "confidence_score", "factor": 50.0},
    # premium shippers get 1.5x the ETA: the shadow gate's disagreement share refuses it
    "shifted_high_value": {"kind": "scale", "output": "eta_prediction", "factor": 1.5, "and_above": ("tier", 1.5)},
}


def drill_candidate(model_bytes: bytes, drill: str) -> bytes:
    """The model with the named `make run` drill fault injected; an unknown name is a ValueError naming them."""
    if drill not in CANDIDATE_DRILLS:
        raise ValueError(f"unknown candidate drill {drill!r}; choose from {sorted(CANDIDATE_DRILLS)}")
    spec = dict(CANDIDATE_DRILLS[drill])
    return faulty_model(model_bytes, spec.pop("kind"), **spec)

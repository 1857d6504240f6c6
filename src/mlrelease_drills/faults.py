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
  the selected rows; a scaled confidence_score is clipped to [0, 1];
- `batch_cost`: the same answers, but the cost of a call grows with the square of its rows: a batch of
  16 rows takes about `factor` (default 20, at most 50) times as long as a batch of 1 inside ONNX Runtime
  (the good model's batch of 16 costs ~2x its batch of 1; this copy's batch of 1 ~1.5-2x the good one's,
  a few tens of us of a ~1 ms Triton request). A candidate that looks fine one request at a time and
  collapses under the batching of a busy hour. eta_prediction waits on the Gram matrix of the input's first
  64 rows tiled r times ([16 r, 16 r] for 16 rows; rows past the 64th, the preferred batch of the config, add
  no work, so memory stays bounded), whose sum only picks between eta and eta: the answers are bit-for-bit
  those of the good model. r (at most 64) is sized when the fault is built by timing batches of 16 and of 1
  through the faulty copy with onnxruntime on the building machine (one intra-op thread, as the CPU Triton's
  model.py runs it); like `slow`, the bytes are not reproducible and a busy machine sizes it less precisely.

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

FAULT_KINDS = ("nan", "error", "slow", "scale", "batch_cost")

# The optional parameters each kind accepts; passing another one is refused rather than ignored.
_PARAMETERS: dict[str, frozenset[str]] = {
    "nan": frozenset({"only_where", "and_above", "and_below"}),
    "error": frozenset(),
    "slow": frozenset({"factor"}),
    "scale": frozenset({"only_where", "and_above", "and_below", "output", "factor"}),
    "batch_cost": frozenset({"factor"}),
}
SLOW_DEFAULT_FACTOR = 3.0
SLOW_MAX_FACTOR = 1000.0
_SLOW_WIDTH = 4 * len(FEATURES)  # columns of the busy matrix: the input's column sums tiled 4 times
_SLOW_LAYERS = 2  # chained MatMuls; the matrix's row count is what the sizing chooses
_SLOW_MAX_ROWS = 1 << 17  # 29 MB per busy matrix
BATCH_COST_DEFAULT_FACTOR = 20.0
BATCH_COST_MAX_FACTOR = 50.0  # about what the most work (r = 64) reaches on this machine's CPU
BATCH_COST_ROWS = 16  # the batch `factor` is about: the rows of one request at the benchmark's peak
_BATCH_COST_MAX_TILES = 64  # r: at most a 1024 x 1024 Gram matrix for 16 rows (4 MB)
_BATCH_COST_WIDTH = 8  # the features tiled 8 times across: more work per float of the Gram matrix
_BATCH_COST_CAP = 64  # rows past the 64th add no work (a 4096 x 4096 Gram matrix at most: 64 MB)


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
    elif kind == "batch_cost":
        model = _batch_cost(model, _batch_cost_factor(factor))
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
    rounds_good: list[float] = []
    rounds_slow: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(rounds_slow) < rounds and (len(rounds_slow) < 3 or time.perf_counter() < deadline):
        rounds_good.append(_median_call(good, feed, calls))  # interleaved: a machine getting busier slows both
        rounds_slow.append(_median_call(slow, feed, calls))
    return float(np.median(rounds_slow) / np.median(rounds_good))


def _median_call(session: Any, feed: dict[str, np.ndarray], calls: int) -> float:
    """The median wall time of `calls` runs of `session` on `feed`, in seconds."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


# --- batch_cost ----------------------------------------------------------------------------------


def _batch_cost_factor(factor: float | None) -> float:
    """The batch_cost factor: the default when not given, else a number in (1, BATCH_COST_MAX_FACTOR]."""
    if factor is None:
        return BATCH_COST_DEFAULT_FACTOR
    if not _finite(factor) or not 1 < factor <= BATCH_COST_MAX_FACTOR:
        raise ValueError(f"batch_cost needs a factor in (1, {BATCH_COST_MAX_FACTOR:g}], got {factor!r}")
    return float(factor)


def _batch_cost(model: ModelProto, factor: float) -> ModelProto:
    """A copy of `model` whose batch of BATCH_COST_ROWS rows costs about `factor` times its batch of 1.

    The tile count r climbs 1, 2, 4, ... until the measured ratio reaches `factor`, then is interpolated
    between the last two steps; the good model alone may already be past a factor close to 1 (r = 1).
    """
    tiles, below = 1, (0, 1.0)
    while True:
        costly = _with_quadratic_work(model, tiles)
        ratio = _batch_ratio(_session(costly.SerializeToString()))
        if ratio >= factor or tiles >= _BATCH_COST_MAX_TILES:
            break
        below, tiles = (tiles, ratio), tiles * 2
    if tiles == 1 or ratio < factor:  # already past it with the least work, or as costly as it gets
        return costly
    fewer, fewer_ratio = below
    # The extra cost is quadratic in r: interpolate on r^2, where the ratio is roughly linear.
    share = (factor - fewer_ratio) / (ratio - fewer_ratio)
    between = round(math.sqrt(fewer**2 + share * (tiles**2 - fewer**2)))
    return costly if between == tiles else _with_quadratic_work(model, between)


def _with_quadratic_work(model: ModelProto, tiles: int) -> ModelProto:
    """A copy of `model` whose eta_prediction waits on the Gram matrix of the input's rows tiled `tiles` times.

    For N rows that is an [N tiles, N tiles] MatMul over the features (N capped at 64): work grows with N^2, then
    stays flat, so no batch can exhaust memory (the parity checks run thousands of rows). Its sum only picks
    the condition of a Where between eta and eta, so the answers stay bit-for-bit the same whatever the input.
    """
    from onnx import ModelProto, helper, numpy_helper

    copy = ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    before = _detach_output(graph, "eta_prediction")
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([0], dtype=np.int64), "fault_first"),
            numpy_helper.from_array(np.array([_BATCH_COST_CAP], dtype=np.int64), "fault_cap"),
            numpy_helper.from_array(np.array([0], dtype=np.int64), "fault_axis0"),
            numpy_helper.from_array(np.array([tiles, _BATCH_COST_WIDTH], dtype=np.int64), "fault_row_tiles"),
            numpy_helper.from_array(np.array(0.0, dtype=np.float32), "fault_zero"),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("Slice", [INPUT, "fault_first", "fault_cap", "fault_axis0"], ["fault_head"]),
            helper.make_node("Tile", ["fault_head", "fault_row_tiles"], ["fault_rows"]),
            helper.make_node("Transpose", ["fault_rows"], ["fault_columns"], perm=[1, 0]),
            helper.make_node("MatMul", ["fault_rows", "fault_columns"], ["fault_gram"]),
            helper.make_node("ReduceSum", ["fault_gram"], ["fault_total"], keepdims=0),
            helper.make_node("Greater", ["fault_total", "fault_zero"], ["fault_either"]),
            helper.make_node("Where", ["fault_either", before, before], ["eta_prediction"]),
        ]
    )
    return copy


def _batch_ratio(session: Any, rounds: int = 9, calls: int = 20) -> float:
    """How many times longer `session` takes on BATCH_COST_ROWS all-zero rows than on one: medians of rounds."""
    small = {INPUT: np.zeros((1, len(FEATURES)), dtype=np.float32)}
    large = {INPUT: np.zeros((BATCH_COST_ROWS, len(FEATURES)), dtype=np.float32)}
    ones, batches = [], []
    for _ in range(rounds):  # interleaved, so a machine that gets busier slows both alike
        ones.append(_median_call(session, small, calls))
        batches.append(_median_call(session, large, calls))
    return float(np.median(batches) / np.median(ones))


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
    # a batch of 16 rows costs ~20x a batch of 1 (a single row barely more than the champion's): the benchmark's
    # peak level (16 requests of 16 rows) refuses it; a sweep of single rows at concurrency <= 16 did not see it
    "batch_cost": {"kind": "batch_cost", "factor": 20},
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

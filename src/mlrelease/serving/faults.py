"""Deliberately faulty model versions for drills and tests: the same ONNX graph, broken in one named way.

Kinds:
- `nan`: eta_prediction becomes NaN, for every row or only where a 0/1 feature is set (e.g. is_remote,
  the long tail);
- `error`: the graph demands one more input column than the config declares, so every inference is
  refused by the runtime inside Triton (a crash-like hard error per request).
"""

from __future__ import annotations

import numpy as np

from mlrelease.model.features import FEATURES
from mlrelease.model.onnx_export import INPUT

FAULT_KINDS = ("nan", "error")


def faulty_model(model_bytes: bytes, kind: str, *, only_where: str | None = None) -> bytes:
    """A copy of a serialized model with the fault `kind` injected (see module docstring)."""
    import onnx

    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {kind!r}; choose from {FAULT_KINDS}")
    model = onnx.load_from_string(model_bytes)
    if kind == "nan":
        _nan_eta(model, only_where)
    else:
        _wider_input(model)
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


def _nan_eta(model: object, only_where: str | None) -> None:
    from onnx import helper, numpy_helper

    graph = model.graph  # type: ignore[attr-defined]
    producer = next(n for n in graph.node if "eta_prediction" in n.output)
    producer.output[list(producer.output).index("eta_prediction")] = "eta_before_fault"
    graph.initializer.append(numpy_helper.from_array(np.array([np.nan], dtype=np.float32), "fault_nan"))
    if only_where is None:
        graph.node.append(helper.make_node("Add", ["eta_before_fault", "fault_nan"], ["eta_prediction"]))
        return
    if only_where not in FEATURES:
        raise ValueError(f"only_where must be a model feature, got {only_where!r}")
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([FEATURES.index(only_where)], dtype=np.int64), "fault_column"),
            numpy_helper.from_array(np.array([0.5], dtype=np.float32), "fault_threshold"),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("Gather", [INPUT, "fault_column"], ["fault_flag"], axis=1),
            helper.make_node("Greater", ["fault_flag", "fault_threshold"], ["fault_mask"]),
            helper.make_node("Where", ["fault_mask", "fault_nan", "eta_before_fault"], ["eta_prediction"]),
        ]
    )


def _wider_input(model: object) -> None:
    from onnx import helper, numpy_helper

    graph = model.graph  # type: ignore[attr-defined]
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

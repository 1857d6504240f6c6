"""mlrelease_drills: the drills and the development harness, kept out of the `mlrelease` product package.

- `faults`: deliberately faulty model versions (the same ONNX graph, broken in one named way) for drills,
  tests and `make run CANDIDATE_FAULT=…`;
- `devkit`: building blocks for tests, benchmarks and drills that run the real components without the DAG
  (quick models, staged model repositories, serving worlds, gateway processes, throwaway Redis, traffic).

It ships in the same distribution but `mlrelease` never imports it, except the export step's drill hook, which
imports `faults` only when MLRELEASE_DRILL_CANDIDATE_FAULT is set (tests/unit/test_layering.py checks this).
"""

"""Benchmark: the cost of parsing the DAG files beyond `import airflow.sdk` (target <= 0.3 s).

Each sample is a fresh interpreter, as the dag-processor's parsing subprocess is:
baseline `import airflow.sdk`, then `import airflow.sdk` + executing every file in dags/, one pair after another.
The cost is read from the pairs (each parse minus the baseline run just before it: the box's load drifts slower
than a pair lasts), from the fastest of each kind (the least disturbed start-ups), and as the parsing interpreter
itself times the DAG files after its `import airflow.sdk` (no start-up noise at all: the figure to trust); a
difference of two unpaired medians swung from -0.1 to 0.4 s between runs here.
    python bench/bench_dag_parse.py [--repeats 21]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BIN, REPO, base_env, median, print_table, timed  # noqa: E402

PARSE = (
    "import sys, runpy, pathlib, time; import airflow.sdk; sys.path.insert(0, {plugins!r});"
    "began = time.perf_counter();"
    "[runpy.run_path(str(p)) for p in sorted(pathlib.Path({dags!r}).glob('*.py'))];"
    "print(time.perf_counter() - began)"
)


def timed_inside(argv: list[str], env: dict[str, str]) -> float:
    """The seconds the DAG files took, as the parsing interpreter itself timed them (no start-up noise)."""
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed: {' '.join(argv)}\n{proc.stderr[-2000:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    """Alternate baseline and parse samples; print medians and the difference."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    env = base_env(
        MLRELEASE_REPO=str(REPO),
        AIRFLOW_CONFIG=str(REPO / "airflow.cfg"),
        AIRFLOW_HOME=tempfile.mkdtemp(prefix="mlrelease-bench-airflow-"),
    )
    python = str(BIN / "python")
    parse = PARSE.format(plugins=str(REPO / "plugins"), dags=str(REPO / "dags"))
    base, full, inside = [], [], []
    for _ in range(args.repeats):
        base.append(timed([python, "-c", "import airflow.sdk"], env))
        full.append(timed([python, "-c", parse], env))
        inside.append(timed_inside([python, "-c", parse], env))
    paired = sorted(f - b for f, b in zip(full, base, strict=True))
    quartiles = statistics.quantiles(paired, n=4)
    print(f"\nDAG parse cost, {args.repeats} pairs of fresh interpreters")
    print_table(
        ["command", "median s", "min s", "max s"],
        [
            ["import airflow.sdk (baseline)", f"{median(base):.3f}", f"{min(base):.3f}", f"{max(base):.3f}"],
            ["import airflow.sdk + dags/*.py", f"{median(full):.3f}", f"{min(full):.3f}", f"{max(full):.3f}"],
            [
                "DAG files alone, paired (target <= 0.3)",
                f"{median(paired):.3f}",
                f"{quartiles[0]:.3f} (Q1)",
                f"{quartiles[2]:.3f} (Q3)",
            ],
            ["DAG files alone, fastest of each", "", f"{min(full) - min(base):.3f}", ""],
            ["DAG files alone, timed inside", f"{median(inside):.3f}", f"{min(inside):.3f}", f"{max(inside):.3f}"],
        ],
    )


if __name__ == "__main__":
    main()

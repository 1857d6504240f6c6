"""Benchmark: the cost of parsing the DAG files beyond `import airflow.sdk` (target <= 0.3 s).

Each sample is a fresh interpreter, as the dag-processor's parsing subprocess is:
baseline `import airflow.sdk`, then `import airflow.sdk` + executing every file in dags/.
    python bench/bench_dag_parse.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BIN, REPO, base_env, median, print_table, timed  # noqa: E402

PARSE = (
    "import sys, runpy, pathlib; import airflow.sdk; sys.path.insert(0, {plugins!r});"
    "[runpy.run_path(str(p)) for p in sorted(pathlib.Path({dags!r}).glob('*.py'))]"
)


def main() -> None:
    """Alternate baseline and parse samples; print medians and the difference."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    env = base_env(
        MLRELEASE_REPO=str(REPO),
        AIRFLOW_CONFIG=str(REPO / "airflow.cfg"),
        AIRFLOW_HOME=tempfile.mkdtemp(prefix="mlrelease-bench-airflow-"),
    )
    python = str(BIN / "python")
    parse = PARSE.format(plugins=str(REPO / "plugins"), dags=str(REPO / "dags"))
    base, full = [], []
    for _ in range(args.repeats):
        base.append(timed([python, "-c", "import airflow.sdk"], env))
        full.append(timed([python, "-c", parse], env))
    diff = median(full) - median(base)
    print(f"\nDAG parse cost, median of {args.repeats} fresh interpreters")
    print_table(
        ["command", "median s", "min s", "max s"],
        [
            ["import airflow.sdk (baseline)", f"{median(base):.3f}", f"{min(base):.3f}", f"{max(base):.3f}"],
            ["import airflow.sdk + dags/*.py", f"{median(full):.3f}", f"{min(full):.3f}", f"{max(full):.3f}"],
            ["DAG files alone (target <= 0.3)", f"{diff:.3f}", "", ""],
        ],
    )


if __name__ == "__main__":
    main()

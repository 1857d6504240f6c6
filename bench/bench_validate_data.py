"""Benchmark: the cost of the data gate (`mlrelease step validate-data`) against the gate it replaced.

For each size (orders per day; users, packages and routes scale with it) ten days of history are generated,
then both gates validate the same nightly window as fresh processes (as a pod would), alternating:
- new: this checkout's gate (per partition: contract, GX suites from config/gx, history-derived bounds,
  cross-partition keys, referential integrity, drift per partition and over the interval, Data Docs);
- baseline: the gate at `--baseline-rev` (one GX run per table over the whole window, window-wide drift),
  run from a git worktree of that revision with the same virtualenv.
Rows/s counts the source rows the new gate checked (all four tables). "vs linear" is the new gate's seconds
per row divided by its seconds per row at the smallest size (1.0 = linear; below 1 = fixed costs amortised).
The share of the nightly run is the gate's time at make run's size over `--nightly-s`.

A/A: `--aa-seeds N` clean histories (other seeds, 2,000 orders/day) through the new gate, in process: every
finding on clean data is a false alarm, so this is the gate's false-fail rate on clean nights.

    python bench/bench_validate_data.py [--sizes 2000 6000 20000 200000] [--repeats 1] [--nightly-s 586] [--aa-seeds 10]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BIN, REPO, base_env, median, print_table, timed  # noqa: E402

START, END = "2026-11-28T02:00:00+00:00", "2026-11-29T02:00:00+00:00"
HISTORY = (date(2026, 11, 19), date(2026, 11, 29))
MAKE_RUN_ROWS = 6000  # the Makefile's ROWS_PER_DAY


def baseline_tree(rev: str, workdir: Path) -> Path:
    """A git worktree of the baseline revision (its src/ is put first on PYTHONPATH)."""
    tree = workdir / "baseline"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), rev], check=True, capture_output=True
    )
    return tree


def run_gate(home: Path, src: Path | None, new: bool) -> tuple[float, dict]:
    """One validate-data process on the window; wall seconds and its XCom result."""
    env = base_env(MLRELEASE_HOME=str(home), MLRELEASE_XCOM_PATH=str(home / "xcom.json"))
    if src is not None:
        env["PYTHONPATH"] = str(src)
    args = ["validate-data", "--start", START, "--end", END]
    if new:
        args += ["--overlap-hours", "2"]
    # The baseline revision's CLI comes from its own src/ (PYTHONPATH), started the same way.
    seconds = timed([str(BIN / "python"), "-m", "mlrelease.cli", "step", *args], env)
    return seconds, json.loads((home / "xcom.json").read_text())


def aa_test(seeds: int, workdir: Path) -> None:
    """Clean nights through the new gate; prints how many passed and any false findings."""
    import os
    from datetime import timedelta

    from mlrelease.data.generate import generate
    from mlrelease.errors import GateFailed
    from mlrelease.settings import Settings
    from mlrelease.steps.validate_data import validate_data
    from mlrelease.timewindow import Window

    failed = []
    for seed in range(100, 100 + seeds):
        home = workdir / f"aa-{seed}"
        generate(home / "data/offline", *HISTORY, rows_per_day=2000, seed=seed)
        os.environ["MLRELEASE_HOME"] = str(home)
        try:
            validate_data(Settings.from_env(), Window.parse(START, END), overlap=timedelta(hours=2), training_days=7)
        except GateFailed as exc:
            failed.append(f"seed {seed}: {exc}")
    print(f"\nA/A: {seeds - len(failed)} of {seeds} clean nights passed (each checks train's 8 days x 4 tables)")
    for line in failed:
        print("  false alarm:", line[:400])


def main() -> None:
    """Generate each size, time both gates, print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, MAKE_RUN_ROWS, 20_000, 200_000])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--baseline-rev", default="0930992", help="the revision before per-partition gates")
    # 586 s: a fresh `make run` on this box (bootstrap night + the release night, promoted), 2026-12-02.
    parser.add_argument("--nightly-s", type=float, default=586.0, help="wall seconds of a fresh make run")
    parser.add_argument("--aa-seeds", type=int, default=10, help="clean histories for the A/A (0: skip)")
    args = parser.parse_args()
    from mlrelease.data.generate import generate

    rows = []
    with tempfile.TemporaryDirectory(prefix="mlrelease-bench-gate-") as tmp:
        workdir = Path(tmp)
        base = baseline_tree(args.baseline_rev, workdir)
        try:
            first_cost = None
            for size in args.sizes:
                home = workdir / f"home-{size}"
                generate(home / "data/offline", *HISTORY, rows_per_day=size, seed=5)
                new_s, base_s, checked = [], [], 0
                for _ in range(args.repeats):
                    seconds, result = run_gate(home, None, new=True)
                    new_s.append(seconds)
                    checked = sum(t["rows"] for t in result["tables"].values())
                    base_s.append(run_gate(home, base / "src", new=False)[0])
                new_t, base_t = median(new_s), median(base_s)
                per_row = new_t / checked
                first_cost = first_cost or per_row
                share = f"{100 * new_t / args.nightly_s:.1f} %" if size == MAKE_RUN_ROWS else ""
                rows.append(
                    [
                        f"{size:,}",
                        f"{checked:,}",
                        f"{base_t:.1f}",
                        f"{new_t:.1f}",
                        f"{checked / new_t:,.0f}",
                        f"{per_row / first_cost:.2f}",
                        share,
                    ]
                )
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], capture_output=True)
    print_table(
        [
            "orders/day",
            "rows checked (4 tables)",
            "baseline s",
            "new gate s",
            "new rows/s",
            "vs linear",
            "share of nightly",
        ],
        rows,
    )
    if args.aa_seeds:
        with tempfile.TemporaryDirectory(prefix="mlrelease-bench-aa-") as tmp:
            aa_test(args.aa_seeds, Path(tmp))


if __name__ == "__main__":
    main()

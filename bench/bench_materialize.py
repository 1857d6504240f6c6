"""Benchmark: `mlrelease step materialize` vs the plain `feast materialize` CLI, same data and window.

Both run as fresh processes (as a pod would), on SQLite and on a real Redis, alternating, several
repeats; rows/s uses the rows written to the online store (one per entity and view). Target:
our step reaches at least 0.95 of Feast's rows/s.
    python bench/bench_materialize.py [--repeats 3] [--rows-per-day 2000]
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
from common import BIN, REPO, base_env, median, print_table, redis_server, timed  # noqa: E402

START, END = "2026-11-28T02:00:00+00:00", "2026-11-29T02:00:00+00:00"
LOAD_FROM = "2026-11-28T00:00:00+00:00"  # START minus the step's default 2 h overlap: the same window for both


def cli_yaml(home: Path, backend: str, redis_url: str | None) -> Path:
    """The repo's YAML for `backend` as the steps read it (state in `home`), written for `feast -f`.

    The repo's YAMLs put state next to the repo (`../.mlrelease`); mlrelease moves it to its MLRELEASE_HOME,
    the CLI needs a file that says so.
    """
    import dataclasses

    import yaml

    from mlrelease.feast_store import config_mapping
    from mlrelease.settings import Settings

    settings = dataclasses.replace(
        Settings.from_env(), home=home, online_store=backend, redis_url=redis_url or "", feast_yaml_override=None
    )
    path = home / f"feature_store.{backend}.yaml"
    path.write_text(yaml.safe_dump(config_mapping(settings), sort_keys=False), encoding="utf-8")
    return path


def bench_backend(backend: str, home: Path, repeats: int, redis_url: str | None) -> list[object]:
    """Time both commands on one online store; returns one table row."""
    env = base_env(
        MLRELEASE_HOME=str(home),
        MLRELEASE_ONLINE_STORE=backend,
        MLRELEASE_XCOM_PATH=str(home / "xcom.json"),
        MLRELEASE_REDIS_URL=redis_url or "",
    )
    subprocess.run([str(BIN / "mlrelease"), "step", "apply-features"], env=env, check=True, capture_output=True)
    # Our step loads only partitions validate-data approved (not timed: the gate has its own benchmark).
    gate = [str(BIN / "mlrelease"), "step", "validate-data", "--start", START, "--end", END, "--reference-days", "0"]
    subprocess.run(gate, env=env, check=True, capture_output=True)
    feast_cmd = [
        str(BIN / "feast"),
        "-c",
        str(REPO / "feature_repo"),
        "-f",
        str(cli_yaml(home, backend, redis_url)),
        "materialize",
        LOAD_FROM,
        END,
    ]
    ours_cmd = [str(BIN / "mlrelease"), "step", "materialize", "--start", START, "--end", END]
    feast_times, ours_times = [], []
    for _ in range(repeats):
        feast_times.append(timed(feast_cmd, env))
        ours_times.append(timed(ours_cmd, env))
    rows = json.loads((home / "xcom.json").read_text())["rows_written"]
    feast_rate, ours_rate = rows / median(feast_times), rows / median(ours_times)
    return [
        backend,
        rows,
        f"{median(feast_times):.2f}",
        f"{median(ours_times):.2f}",
        f"{feast_rate:,.0f}",
        f"{ours_rate:,.0f}",
        f"{ours_rate / feast_rate:.3f}",
    ]


def main() -> None:
    """Generate data once, benchmark SQLite and Redis, print the comparison table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows-per-day", type=int, default=2000)
    args = parser.parse_args()
    from mlrelease.data.generate import generate

    rows = []
    with tempfile.TemporaryDirectory(prefix="mlrelease-bench-") as tmp:
        for backend in ("sqlite", "redis"):
            home = Path(tmp) / backend
            generate(home / "data" / "offline", date(2026, 11, 27), date(2026, 11, 29), rows_per_day=args.rows_per_day)
            if backend == "redis":
                with redis_server() as url:
                    rows.append(bench_backend(backend, home, args.repeats, url))
            else:
                rows.append(bench_backend(backend, home, args.repeats, None))
    print(f"\nmaterialize one 26 h window, {args.rows_per_day} orders/day, median of {args.repeats} runs per command")
    print_table(
        [
            "online store",
            "rows written",
            "feast CLI s",
            "mlrelease step s",
            "feast rows/s",
            "mlrelease rows/s",
            "ratio (target >= 0.95)",
        ],
        rows,
    )


if __name__ == "__main__":
    main()

"""Benchmark: the data half (validate-data + materialize) on pandas and on a local Spark cluster, side by side.

For each size (orders per day; users, packages and routes scale with it) five days of history are generated
(three reference days and the two days of one nightly window), then each engine runs the DAG's steps as fresh
processes, as a pod would: `apply-features`, `validate-data` (overlap 2 h, 3 reference days) and `materialize`
into a real Redis. pandas is the embedded default (file offline store); Spark is `feature_store.spark.yaml` on
a standalone master with two workers (one core, 1 GB each; `--workers` to change) started from the pyspark
package. Peak memory is the largest resident set seen (sampled every 0.2 s) of the step's process tree (the
driver, for Spark) and, for Spark, of the executors' JVMs together. Rows/s counts the source rows the gate
checked (all four tables).

    python bench/bench_data_engines.py [--sizes 200000 1000000 5000000] [--workers 2] [--engines pandas spark]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BIN, REPO, base_env, print_table, redis_server  # noqa: E402

START, END = "2026-11-28T02:00:00+00:00", "2026-11-29T02:00:00+00:00"
HISTORY = (date(2026, 11, 25), date(2026, 11, 29))
SPARK_YAML = REPO / "feature_repo" / "feature_store.spark.yaml"


def tree_rss(pids: list[int]) -> int:
    """Resident bytes of the processes and all their descendants."""
    total = 0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def run_step(args: list[str], env: dict[str, str], executors: list[int]) -> tuple[float, int, int, dict]:
    """One `mlrelease step` process: wall seconds, peak RSS of its tree and of the executors, its XCom result."""
    peaks = [0, 0]
    proc = subprocess.Popen([str(BIN / "mlrelease"), "step", *args], env=env, stderr=subprocess.PIPE, text=True)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peaks[0] = max(peaks[0], tree_rss([proc.pid]))
            peaks[1] = max(peaks[1], tree_rss(executors) if executors else 0)
            time.sleep(0.2)

    watcher = threading.Thread(target=sample, daemon=True)
    began = time.perf_counter()
    watcher.start()
    _, stderr = proc.communicate()
    elapsed = time.perf_counter() - began
    done.set()
    watcher.join()
    if proc.returncode != 0:
        raise SystemExit(f"mlrelease step {' '.join(args)} failed ({proc.returncode}):\n{stderr[-3000:]}")
    return elapsed, peaks[0], peaks[1], json.loads(Path(env["MLRELEASE_XCOM_PATH"]).read_text())


def engine_env(engine: str, home: Path, redis_url: str, master: str) -> dict[str, str]:
    """The step processes' environment for one engine (Redis online store either way)."""
    env = base_env(
        MLRELEASE_HOME=str(home),
        MLRELEASE_XCOM_PATH=str(home / "xcom.json"),
        MLRELEASE_ONLINE_STORE="redis",
        MLRELEASE_REDIS_URL=redis_url,
        MLRELEASE_MODEL="parcel_eta",
    )
    env.pop("FEAST_FS_YAML_FILE_PATH", None)
    if engine == "spark":
        env.update(
            FEAST_FS_YAML_FILE_PATH=str(SPARK_YAML),
            MLRELEASE_SPARK_MASTER=master,
            MLRELEASE_FEAST_REGISTRY_URL=f"sqlite:///{home}/feast_registry.db",
            SPARK_LOCAL_IP="127.0.0.1",
        )
    return env


def measure(engine: str, offline: Path, workdir: Path, redis_url: str, master: str, executors: list[int]) -> dict:
    """apply-features, validate-data and materialize on one engine over a copy of the generated history."""
    import redis

    home = workdir / engine
    (home / "data").mkdir(parents=True)
    os.symlink(offline, home / "data" / "offline")  # both engines read the same files
    redis.Redis.from_url(f"redis://{redis_url}").flushall()
    env = engine_env(engine, home, redis_url, master)
    run_step(["apply-features"], env, [])
    window = ["--start", START, "--end", END, "--overlap-hours", "2"]
    v_s, v_driver, v_exec, validated = run_step(["validate-data", *window, "--reference-days", "3"], env, executors)
    m_s, m_driver, m_exec, loaded = run_step(["materialize", *window], env, executors)
    rows = sum(t["rows"] for t in validated["tables"].values())
    return {
        "validate_s": v_s,
        "materialize_s": m_s,
        "rows": rows,
        "written": loaded["rows_written"],
        "driver_mb": max(v_driver, m_driver) / 2**20,
        "executors_mb": max(v_exec, m_exec) / 2**20,
    }


def main() -> None:
    """Generate each size once, run both engines on it, print the side-by-side table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 1_000_000])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--engines", nargs="+", choices=("pandas", "spark"), default=["pandas", "spark"])
    args = parser.parse_args()
    from mlrelease.data.generate import generate
    from mlrelease.spark.cluster import LocalSparkCluster

    table = []
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp, redis_server() as redis_url:
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        with LocalSparkCluster(Path(tmp) / "spark", workers=args.workers) as cluster:
            workers = [p.pid for p in cluster.processes[1:]]  # the workers start the executors as their children
            for size in args.sizes:
                offline = Path(tmp) / f"offline-{size}"
                began = time.perf_counter()
                generate(offline, *HISTORY, rows_per_day=size, seed=3)
                print(f"# {size:,} orders/day: history generated in {time.perf_counter() - began:.0f} s", flush=True)
                for engine in args.engines:
                    r = measure(engine, offline, Path(tmp) / f"run-{size}", redis_url, cluster.master_url, workers)
                    print(f"#   {engine}: {r}", flush=True)
                    table.append(
                        [
                            f"{size:,}",
                            engine,
                            f"{r['validate_s']:.1f}",
                            f"{r['materialize_s']:.1f}",
                            f"{r['rows'] / r['validate_s']:,.0f}",
                            f"{r['driver_mb']:,.0f}",
                            f"{r['executors_mb']:,.0f}" if engine == "spark" else "-",
                            f"{r['written']:,}",
                        ]
                    )
    print_table(
        [
            "orders/day",
            "engine",
            "validate s",
            "materialize s",
            "rows/s (validate)",
            "peak MB (step / driver)",
            "peak MB (workers + executors)",
            "entities written",
        ],
        table,
    )


if __name__ == "__main__":
    main()

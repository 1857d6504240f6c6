"""Benchmark: Triton (HTTP and gRPC, real perf_analyzer) vs in-process onnxruntime, and ONNX vs native predict.

A model is trained on generated data (no Feast/MLflow needed for a serving benchmark), exported with the
same code as the export step, served by the real CPU tritonserver, and measured side by side:
    python bench/bench_serving.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table  # noqa: E402

CONCURRENCY = (1, 2, 3, 4)


def demo_model(workdir: Path):  # type: ignore[no-untyped-def]
    """An EtaModel trained on two weeks of generated orders joined to their features."""
    from mlrelease.data.generate import generate
    from mlrelease_drills.devkit import quick_model

    generate(workdir, date(2026, 11, 15), date(2026, 11, 28), rows_per_day=2000)
    return quick_model(workdir)


def in_process(model_bytes: bytes, X, concurrency: int, seconds: float) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    """Throughput and p50/p99 latency (ms) of onnxruntime called from `concurrency` threads, batch 1."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    stop = time.perf_counter() + seconds

    def worker(i: int) -> None:
        row = 0
        while time.perf_counter() < stop:
            began = time.perf_counter()
            session.run(None, {"features": X[row % len(X)][None, :]})
            latencies[i].append(time.perf_counter() - began)
            row += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = sorted(x for xs in latencies for x in xs)
    return len(flat) / seconds, flat[len(flat) // 2] * 1e3, flat[int(len(flat) * 0.99)] * 1e3


def per_call_ms(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    """Median milliseconds of `fn()` over `repeats` calls."""
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - began) * 1e3)
    return statistics.median(samples)


def main() -> None:  # noqa: C901 - a linear script: set up, measure, print
    """Train, export, serve, measure; print both tables."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="in-process measurement per concurrency level")
    args = parser.parse_args()
    import onnxruntime as ort

    from mlrelease.model.features import FEATURES
    from mlrelease.model.onnx_export import OUTPUTS, to_onnx
    from mlrelease.serving import local_triton
    from mlrelease.serving.endpoint import publish_to_local_server
    from mlrelease.serving.local_triton import Ports, TritonPaths, toolchain_env
    from mlrelease.serving.perf import PerfSettings, run_perf_analyzer
    from mlrelease.serving.triton_client import TritonClient
    from mlrelease.serving.triton_repo import ServingConfig, build_config, write_config, write_version
    from mlrelease.settings import Settings

    with tempfile.TemporaryDirectory(prefix="mlrelease-bench-serving-") as tmp:
        home = Path(tmp)
        os.environ["MLRELEASE_HOME"] = str(home)
        for name in ("HTTP", "GRPC", "METRICS"):
            os.environ.setdefault(
                f"MLRELEASE_TRITON_{name}_PORT", str({"HTTP": 18100, "GRPC": 18101, "METRICS": 18102}[name])
            )
        model, X = demo_model(home / "offline")
        model_bytes = to_onnx(model)
        root = home / "model_repository"
        write_version(root, "parcel_eta", 1, model_bytes, {})
        write_config(root, build_config("parcel_eta", len(FEATURES), OUTPUTS, [1], ServingConfig()))
        settings = Settings.from_env()
        publish_to_local_server(settings, root)
        local_triton.up(settings)
        try:
            client = TritonClient(Ports.from_env().http_url)
            client.load("parcel_eta")
            client.wait_ready("parcel_eta", 1)
            paths = TritonPaths.from_settings(settings)
            env = toolchain_env(paths)
            perf = PerfSettings(concurrency_range="1:4:1", measurement_interval_ms=1000)
            rows = {c: [c] for c in CONCURRENCY}
            for protocol, port in (("http", Ports.from_env().http), ("grpc", Ports.from_env().grpc)):
                levels, _ = run_perf_analyzer(
                    paths.perf_analyzer,
                    env,
                    f"http://127.0.0.1:{port}",
                    "parcel_eta",
                    1,
                    home / f"{protocol}.csv",
                    perf,
                    protocol=protocol,
                )
                for level in levels:
                    rows[level.concurrency] += [
                        f"{level.throughput:,.0f}",
                        f"{level.p50_us / 1000:.2f}",
                        f"{level.p99_us / 1000:.2f}",
                    ]
            for c in CONCURRENCY:
                tput, p50, p99 = in_process(model_bytes, X, c, args.seconds)
                rows[c] += [f"{tput:,.0f}", f"{p50:.2f}", f"{p99:.2f}"]
        finally:
            local_triton.down(settings)

        print("\nbatch 1, CPU: Triton python backend running onnxruntime (perf_analyzer) vs onnxruntime in-process")
        print_table(
            [
                "concurrency",
                "HTTP infer/s",
                "HTTP p50 ms",
                "HTTP p99 ms",
                "gRPC infer/s",
                "gRPC p50 ms",
                "gRPC p99 ms",
                "in-process infer/s",
                "in-process p50 ms",
                "in-process p99 ms",
            ],
            [rows[c] for c in CONCURRENCY],
        )

        session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
        speed = []
        for batch in (1, 256):
            sample = X[:batch]
            native = per_call_ms(lambda s=sample: model.predict_with_confidence(s), 200)
            onnx = per_call_ms(lambda s=sample: session.run(None, {"features": s}), 200)
            speed.append([batch, f"{native:.3f}", f"{onnx:.3f}", f"{native / onnx:.1f}x"])
        print("\nONNX (onnxruntime) vs native (scikit-learn) predict, both outputs, median of 200 calls")
        print_table(["batch", "native ms", "onnxruntime ms", "speed-up"], speed)


if __name__ == "__main__":
    main()

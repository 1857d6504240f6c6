"""Talking to a running Triton through tritonclient: model control (explicit mode), readiness, config, inference."""

from __future__ import annotations

import http.client
import re
import time
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from mlrelease.errors import StepError

_STUB_TRACEBACK = re.compile(r"\n\nAt:\n(?:  .*\n?)*")  # "At:" then one indented line per frame


def one_line_reason(text: str) -> str:
    """Triton's refusal as one line: the python backend appends the stub's traceback ("At: …") to each reason."""
    return " ".join(_STUB_TRACEBACK.sub(" ", text).split())


class TritonUnreachable(StepError):
    """The server did not answer at all (refused, reset, timed out): nothing about the model is known."""


def host_port(url: str) -> tuple[str, bool]:
    """`host:port` and whether TLS is used, from a URL such as http://triton:8000 or https://triton.example."""
    from urllib.parse import urlsplit

    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise StepError(f"Triton URL {url!r} is not an http(s)://host:port URL")
    default = 443 if parts.scheme == "https" else 8000
    return f"{parts.hostname}:{parts.port or default}", parts.scheme == "https"


class TritonClient:
    """A wrapper over `tritonclient.http` that turns transport and server errors into StepErrors naming the cause.

    :param url: base URL, e.g. http://127.0.0.1:8000.
    :param timeout: seconds per request.
    """

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        import tritonclient.http as httpclient

        self.url = url.rstrip("/")
        self._http = httpclient
        address, tls = host_port(self.url)
        self._client = httpclient.InferenceServerClient(
            address, ssl=tls, connection_timeout=timeout, network_timeout=timeout
        )

    def _do(self, what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        from tritonclient.utils import InferenceServerException

        try:
            return call(*args, **kwargs)
        except InferenceServerException as exc:
            if str(exc.status()) in ("502", "503", "504"):  # a proxy in front of Triton: an outage, not a verdict
                raise TritonUnreachable(f"{what}: Triton at {self.url} is unavailable ({exc.message()})") from None
            raise StepError(f"{what} failed on Triton at {self.url}: {exc.message()}") from None
        except (OSError, http.client.HTTPException) as exc:  # refused / reset / closed / timed out
            raise TritonUnreachable(
                f"Triton at {self.url} is not reachable ({type(exc).__name__}: {exc}); "
                "start it with `mlrelease triton up`"
            ) from None

    def ensure_live(self) -> None:
        """Fail clearly unless the server answers live."""
        if not self._do("liveness check", self._client.is_server_live):
            raise StepError(f"Triton at {self.url} is not live")

    def load(self, model: str, config: mc.ModelConfig | None = None) -> None:
        """Load (or reload) a model, optionally with a config override; a refused load names Triton's reason."""
        override = None if config is None else json_format.MessageToJson(config, preserving_proto_field_name=True)
        self._do(f"loading {model}", self._client.load_model, model, config=override)

    def unload(self, model: str) -> None:
        """Unload every version of a model (asynchronous in Triton)."""
        self._do(f"unloading {model}", self._client.unload_model, model)

    def version_ready(self, model: str, version: int) -> bool:
        """Whether a specific version is loaded and ready."""
        return bool(self._do("readiness check", self._client.is_model_ready, model, str(version)))

    def wait_ready(self, model: str, version: int, timeout_s: float = 60.0) -> None:
        """Wait for a version to become ready; fail naming it after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.version_ready(model, version):
                return
            time.sleep(0.2)
        raise StepError(f"{model} version {version} did not become ready within {timeout_s:.0f} s")

    def model_config(self, model: str, version: int) -> dict[str, Any]:
        """The config Triton reports for a loaded version."""
        return dict(self._do("reading the model config", self._client.get_model_config, model, str(version)))

    def infer(self, model: str, version: int, features: np.ndarray, outputs: tuple[str, ...]) -> dict[str, np.ndarray]:
        """Run one batch through a version; returns each output flattened to 1-D (a missing one is a StepError)."""
        answers = self.infer_tensors(model, version, features, outputs)
        missing = [name for name in outputs if name not in answers]
        if missing:
            raise StepError(f"inference on {model} version {version} returned no output {', '.join(missing)}")
        return {name: answers[name].reshape(-1) for name in outputs}

    def infer_tensors(
        self, model: str, version: int, features: np.ndarray, outputs: tuple[str, ...]
    ) -> dict[str, np.ndarray]:
        """Run one batch through a version; each output as Triton returned it (shape and dtype kept), absent if not."""
        batch = self._http.InferInput("features", list(features.shape), "FP32")
        batch.set_data_from_numpy(features.astype(np.float32), binary_data=True)
        requested = [self._http.InferRequestedOutput(name, binary_data=True) for name in outputs]
        result = self._do(
            f"inference on {model} version {version}",
            self._client.infer,
            model,
            [batch],
            model_version=str(version),
            outputs=requested,
        )
        answers = {name: result.as_numpy(name) for name in outputs}
        return {name: array for name, array in answers.items() if array is not None}

    def inference_stats(self, model: str, version: int) -> dict[str, int]:
        """Triton's cumulative server-side counters for one version: successes, queue / compute time (ns), and
        rows inferred vs model executions (their ratio is the batch size the model actually ran)."""
        raw: dict[str, Any] = self._do(
            "reading inference statistics", self._client.get_inference_statistics, model, str(version)
        )
        entries: list[dict[str, Any]] = raw.get("model_stats") or []
        entry: dict[str, Any] = entries[0] if entries else {}
        stats: dict[str, Any] = entry.get("inference_stats") or {}

        def field(name: str, part: str) -> int:
            return int((stats.get(name) or {}).get(part, 0))

        return {
            "success": field("success", "count"),
            "queue_ns": field("queue", "ns"),
            "compute_ns": field("compute_infer", "ns"),
            "inferences": int(entry.get("inference_count", 0)),
            "executions": int(entry.get("execution_count", 0)),
        }

    def close(self) -> None:
        """Close the connection (an idle keep-alive connection delays a server's shutdown)."""
        self._client.close()

    def index(self) -> list[dict[str, Any]]:
        """The repository index: every model/version Triton knows and its state."""
        return list(self._do("reading the repository index", self._client.get_model_repository_index))


def require_ready(url: str, model: str, versions: list[int]) -> None:
    """Refuse (StepError) unless Triton at `url` has every listed version of `model` ready."""
    client = TritonClient(url, timeout=5)
    try:
        missing = [v for v in versions if not client.version_ready(model, v)]
    finally:
        client.close()
    if missing:
        raise StepError(f"{model} version(s) {missing} are not ready on Triton at {url}; load them first")

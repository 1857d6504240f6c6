"""Async inference against the versions of one Triton model: batches of rows in, per-row outputs out (named by
the model's release spec).

Whole-call failures (an error status, a lost connection, a timeout, a malformed answer) raise
ModelFailure; the per-row output checks live with the batcher, which knows which request owns a row.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import numpy as np
import orjson

from mlrelease.gateway.guard import OutputRanges, output_problem
from mlrelease.gateway.triton_http import HttpAnswer, TritonHttp, TritonHttpError, infer_request
from mlrelease.serving.triton_client import host_port

_DTYPES: dict[str, np.dtype[Any]] = {
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "FP16": np.dtype(np.float16),
}


class ModelFailure(Exception):
    """A hard failure of one version: `kind` is error, timeout, nan or out_of_range; `call` is the failed model call
    when several requests' rows shared it (one batch: one piece of evidence for the fast guard)."""

    def __init__(self, kind: str, detail: str, call: object | None = None) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail
        self.call = call


@dataclass(frozen=True, slots=True)
class ModelAnswer:
    """What a version answered for one request: its prediction and score outputs (named in the release spec)."""

    prediction: float
    score: float


class TritonModelClient:
    """Pooled keep-alive HTTP connections to Triton for every version of one model.

    :param url: Triton's HTTP endpoint, e.g. http://127.0.0.1:8000.
    :param model: the model name in the repository.
    :param ranges: the valid prediction and score; an answer outside them counts as a failure.
    :param outputs: the names of the prediction and score outputs (the model's release spec).
    """

    def __init__(self, url: str, model: str, ranges: OutputRanges, outputs: tuple[str, str]) -> None:
        address, tls = host_port(url)
        if tls:  # the lean client speaks plain HTTP: Triton is reached inside the cluster, never over TLS
            raise ValueError(f"the gateway talks plain HTTP to Triton; {url} asks for TLS")
        host, port = address.rsplit(":", 1)
        self.model = model
        self.outputs = outputs
        self._ranges = ranges
        self._quoted = quote(model)
        # Two pools: a slow stable version holding every connection must not make the candidate's
        # calls wait for one past their short timeout (and trip a healthy candidate).
        self._pools = {role: TritonHttp(host, int(port)) for role in ("stable", "candidate")}
        self._headers: dict[int, bytes] = {}  # JSON request header per batch size: built once

    async def infer_rows(
        self, version: int, rows: np.ndarray, deadline: float, role: str = "stable"
    ) -> tuple[np.ndarray, np.ndarray]:
        """Prediction and score per row of an encoded [n, F] batch, by `deadline` (loop time); raises ModelFailure."""
        n, n_features = rows.shape
        header = self._headers.get(n)
        if header is None:
            header = self._headers[n] = infer_request(n, n_features, self.outputs)
        path = f"/v2/models/{self._quoted}/versions/{version}/infer"
        extra = f"Inference-Header-Content-Length: {len(header)}\r\n".encode()
        body = header + np.ascontiguousarray(rows, dtype=np.float32).tobytes()
        try:
            async with asyncio.timeout_at(deadline):  # cheaper than wait_for: no extra task per call
                answer = await self._pools[role].request("POST", path, body, extra)
        except TimeoutError:
            raise ModelFailure("timeout", f"version {version} did not answer in time") from None
        except TritonHttpError as exc:
            raise ModelFailure("error", f"version {version}: {exc}") from None
        return _outputs(answer, version, n, self.outputs)

    async def predict(self, version: int, row: np.ndarray, timeout_s: float, role: str = "stable") -> ModelAnswer:
        """Prediction and score for one encoded row, unbatched; anything unusable raises ModelFailure."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        prediction, score = await self.infer_rows(version, row.reshape(1, -1), deadline, role)
        p, c = float(prediction[0]), float(score[0])
        problem = output_problem(p, c, self._ranges)
        if problem:
            raise ModelFailure(problem, answered(version, p, c, self.outputs))
        return ModelAnswer(p, c)

    async def version_ready(self, version: int) -> bool:
        """Whether Triton reports the version ready (False when Triton does not answer)."""
        try:
            async with asyncio.timeout(2.0):
                path = f"/v2/models/{self._quoted}/versions/{version}/ready"
                return (await self._pools["stable"].request("GET", path)).status == 200
        except (TimeoutError, TritonHttpError):
            return False

    async def max_batch_size(self) -> int | None:
        """The model's max_batch_size from Triton's config (None when Triton does not say)."""
        try:
            async with asyncio.timeout(2.0):
                answer = await self._pools["stable"].request("GET", f"/v2/models/{self._quoted}/config")
            config: dict[str, Any] = orjson.loads(answer.body) if answer.status == 200 else {}
        except (TimeoutError, TritonHttpError, orjson.JSONDecodeError):
            return None
        value = config.get("max_batch_size")
        return int(value) if isinstance(value, int) else None

    async def close(self) -> None:
        """Close the pooled connections."""
        for pool in self._pools.values():
            pool.close()


def _outputs(answer: HttpAnswer, version: int, n: int, outputs: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """The two outputs of an inference answer, flattened to [n] each; anything else is a ModelFailure."""
    try:
        if answer.status != 200:
            message = orjson.loads(answer.body).get("error", "") if answer.body else ""
            raise ModelFailure("error", f"version {version}: HTTP {answer.status} {message}".rstrip())
        split = answer.header_length if answer.header_length is not None else len(answer.body)
        header = orjson.loads(answer.body[:split])
        found: dict[str, np.ndarray] = {}
        offset = split
        for output in header.get("outputs", ()):
            dtype = _DTYPES[output["datatype"]]
            size = (output.get("parameters") or {}).get("binary_data_size")
            if size is None:  # JSON-encoded output data
                found[output["name"]] = np.asarray(output["data"], dtype=dtype)
            else:
                found[output["name"]] = np.frombuffer(
                    answer.body, dtype=dtype, count=size // dtype.itemsize, offset=offset
                )
                offset += size
        prediction, score = (found[name].reshape(-1) for name in outputs)
    except ModelFailure:
        raise
    except (KeyError, ValueError, TypeError, AttributeError) as exc:  # orjson's decode error is a ValueError
        raise ModelFailure("error", f"version {version}: unreadable answer ({type(exc).__name__}: {exc})") from None
    if len(prediction) != n or len(score) != n:
        raise ModelFailure("error", f"version {version} answered {len(prediction)} rows for {n}")
    return prediction, score


def answered(version: int, prediction: float, score: float, outputs: tuple[str, str]) -> str:
    """What a version answered, in its outputs' names (for a failure's detail)."""
    return f"version {version} answered {outputs[0]}={prediction!r}, {outputs[1]}={score!r}"

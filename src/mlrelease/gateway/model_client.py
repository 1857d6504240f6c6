"""Async inference against one Triton model version, with a client-side timeout and output checks."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
import tritonclient.http.aio as aiohttpclient
from tritonclient.utils import InferenceServerException

from mlrelease.gateway.guard import output_problem
from mlrelease.serving.triton_client import host_port

OUTPUTS = ("eta_prediction", "confidence_score")


class ModelFailure(Exception):
    """A hard failure of one version: `kind` is error, timeout, nan or out_of_range."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


@dataclass(frozen=True)
class ModelAnswer:
    """What a version answered for one request."""

    eta: float
    confidence: float


class TritonModelClient:
    """One pooled async HTTP client to Triton for every version of one model.

    :param url: Triton's HTTP endpoint, e.g. http://127.0.0.1:8000.
    :param model: the model name in the repository.
    :param eta_range: (min, max) hours outside which an answer counts as a failure.
    """

    def __init__(self, url: str, model: str, eta_range: tuple[float, float], conn_limit: int = 128) -> None:
        address, tls = host_port(url)
        self.model = model
        self._eta_range = eta_range
        # Two pools: a slow stable version holding every connection must not make the candidate's
        # calls wait for one past their short timeout (and trip a healthy candidate).
        self._clients = {
            role: aiohttpclient.InferenceServerClient(address, ssl=tls, conn_limit=conn_limit)
            for role in ("stable", "candidate")
        }

    async def predict(self, version: int, row: np.ndarray, timeout_s: float, role: str = "stable") -> ModelAnswer:
        """ETA and confidence for one encoded row from one version; anything unusable raises ModelFailure."""
        batch = aiohttpclient.InferInput("features", list(row.shape), "FP32")
        batch.set_data_from_numpy(row, binary_data=True)
        outputs = [aiohttpclient.InferRequestedOutput(name, binary_data=True) for name in OUTPUTS]
        try:
            async with asyncio.timeout(timeout_s):  # cheaper than wait_for: no extra task per request
                result = await self._clients[role].infer(
                    self.model, [batch], model_version=str(version), outputs=outputs
                )
            eta = float(result.as_numpy(OUTPUTS[0]).reshape(-1)[0])
            confidence = float(result.as_numpy(OUTPUTS[1]).reshape(-1)[0])
        except TimeoutError:
            raise ModelFailure("timeout", f"version {version} took over {timeout_s * 1000:.0f} ms") from None
        except InferenceServerException as exc:
            raise ModelFailure("error", f"version {version}: {exc.message()}") from None
        except Exception as exc:  # aiohttp connection errors and malformed responses: Triton failed us
            raise ModelFailure("error", f"version {version}: {type(exc).__name__}: {exc}") from None
        problem = output_problem(eta, confidence, *self._eta_range)
        if problem:
            raise ModelFailure(problem, f"version {version} answered eta={eta!r}, confidence={confidence!r}")
        return ModelAnswer(eta, confidence)

    async def version_ready(self, version: int) -> bool:
        """Whether Triton reports the version ready (False when Triton does not answer)."""
        try:
            return bool(await self._clients["stable"].is_model_ready(self.model, str(version)))
        except Exception:
            return False

    async def close(self) -> None:
        """Close the connection pool."""
        for client in self._clients.values():
            await client.close()

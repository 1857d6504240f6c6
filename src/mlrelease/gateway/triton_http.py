"""A lean HTTP/1.1 client for Triton's inference endpoints: pooled keep-alive connections, httptools parsing.

The gateway's request path spent about a quarter of its CPU inside tritonclient's aiohttp-based client
(request objects, timers, header handling) for a call that is one POST of a few hundred bytes. This one
writes the request bytes itself and parses the answer with httptools (the parser uvicorn uses): one
`create_connection` per pooled connection, then a write and a parse per call.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import cast

import httptools
import orjson


class TritonHttpError(Exception):
    """The connection failed or the answer could not be read (not an HTTP error status)."""


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """Status, the `Inference-Header-Content-Length` header (None when absent) and the body."""

    status: int
    header_length: int | None
    body: bytes


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request at a time, its answer parsed as it arrives."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[HttpAnswer] | None = None
        self._chunks: list[bytes] = []
        self._header_length: int | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport (uvloop's is not an asyncio.Transport subclass, but has its methods)."""
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        """Feed the parser; a malformed answer fails the waiting call and the connection."""
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(TritonHttpError(f"malformed HTTP answer from Triton: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        """The server closed (restart, idle timeout): fail a waiting call, never reuse the connection."""
        self.closed = True
        self._fail(TritonHttpError(f"connection to Triton lost: {exc or 'closed by the server'}"))

    # httptools callbacks
    def on_message_begin(self) -> None:
        """A new answer starts."""
        self._chunks, self._header_length = [], None

    def on_header(self, name: bytes, value: bytes) -> None:
        """Only the binary-tensor header length matters here."""
        if name.lower() == b"inference-header-content-length":
            self._header_length = int(value)

    def on_body(self, body: bytes) -> None:
        """Collect the body."""
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        """The answer is complete: hand it to the waiting call."""
        waiter, self._waiter = self._waiter, None
        if not self._parser.should_keep_alive():
            self.close()
        if waiter is not None and not waiter.done():
            waiter.set_result(HttpAnswer(self._parser.get_status_code(), self._header_length, b"".join(self._chunks)))

    def send(self, request: bytes) -> asyncio.Future[HttpAnswer]:
        """Write one request; the future holds its answer."""
        assert self.transport is not None and self._waiter is None
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self._waiter

    def close(self) -> None:
        """Close the socket (a connection with an answer still due is never reused)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


class TritonHttp:
    """A pool of keep-alive connections to one Triton HTTP endpoint.

    :param host: host name or address.
    :param port: Triton's HTTP port.
    :param max_idle: idle connections kept for reuse (more are closed when returned).
    """

    def __init__(self, host: str, port: int, max_idle: int = 32) -> None:
        self.host, self.port, self.max_idle = host, port, max_idle
        self._idle: list[_Connection] = []
        self._host_header = f"Host: {host}:{port}\r\n".encode()

    async def request(self, method: str, path: str, body: bytes = b"", headers: bytes = b"") -> HttpAnswer:
        """One request on a pooled connection; `headers` are extra raw header lines (each ending in CRLF)."""
        head = (
            f"{method} {path} HTTP/1.1\r\n".encode()
            + self._host_header
            + headers
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        connection = await self._acquire()
        try:
            answer = await connection.send(head + body)
        except BaseException:
            connection.close()  # a timeout or cancellation leaves an answer due on it: never reuse it
            raise
        self._release(connection)
        return answer

    async def _acquire(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection
        loop = asyncio.get_running_loop()
        try:
            _, connection = await loop.create_connection(_Connection, self.host, self.port)
        except OSError as exc:
            raise TritonHttpError(f"cannot connect to Triton at {self.host}:{self.port}: {exc}") from None
        return connection

    def _release(self, connection: _Connection) -> None:
        if connection.closed:
            return
        if len(self._idle) < self.max_idle:
            self._idle.append(connection)
        else:
            connection.close()

    def close(self) -> None:
        """Close every idle connection."""
        for connection in self._idle:
            connection.close()
        self._idle.clear()


def infer_request(n_rows: int, n_features: int, outputs: tuple[str, ...], input_name: str = "features") -> bytes:
    """The JSON header of a binary-tensor inference request for an FP32 [n_rows, n_features] input."""
    return orjson.dumps(
        {
            "inputs": [
                {
                    "name": input_name,
                    "shape": [n_rows, n_features],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": n_rows * n_features * 4},
                }
            ],
            "outputs": [{"name": name, "parameters": {"binary_data": True}} for name in outputs],
        }
    )

"""A small HTTP/1.1 server on asyncio streams: what an OpenAI-compatible endpoint needs
(JSON requests with a Content-Length, JSON responses, server-sent events in chunked
encoding, keep-alive) and nothing more, so the policy server adds no dependency to
rl-rollout and runs in the rollout manager's own event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["HttpError", "HttpServer", "Request", "Response", "StreamResponse"]

log = logging.getLogger(__name__)

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 411: "Length Required", 413: "Payload Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}  # fmt: skip


class HttpError(Exception):
    """An error answered as ``{"error": {...}}`` with an HTTP status (OpenAI's layout)."""

    def __init__(self, status: int, message: str, code: str = "invalid_request_error") -> None:
        self.status, self.code = status, code
        super().__init__(message)

    def body(self) -> dict[str, Any]:
        kind = "authentication_error" if self.status == 401 else "invalid_request_error"
        return {"error": {"message": str(self), "type": kind, "param": None, "code": self.code}}


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"{}")
        except ValueError as exc:
            raise HttpError(400, f"the request body is not JSON: {exc}") from None

    def bearer(self) -> str | None:
        auth = self.headers.get("authorization", "")
        return auth[7:].strip() if auth.lower().startswith("bearer ") else None


@dataclass
class Response:
    status: int
    body: Any


@dataclass
class StreamResponse:
    """Server-sent events: each item of `events` is sent as ``data: <json>``, then
    ``data: [DONE]``."""

    events: AsyncIterator[dict[str, Any]]


Handler = Callable[[Request], Awaitable[Response | StreamResponse]]


class HttpServer:
    """Routes ``(method, path) -> handler`` on ``host:port`` (port 0: the OS picks)."""

    def __init__(self, routes: dict[tuple[str, str], Handler], max_body: int = 64 << 20) -> None:
        self.routes = routes
        self.max_body = max_body
        self.server: asyncio.AbstractServer | None = None
        self.port = 0
        self._connections: set[asyncio.Task] = set()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self.server = await asyncio.start_server(self._serve, host, port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            for task in list(self._connections):
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 5)
            self.server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            while True:
                request = await self._read(reader)
                if request is None:
                    break
                keep = request.headers.get("connection", "").lower() != "close"
                await self._answer(request, writer)
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        except HttpError as exc:  # a malformed request: answer and hang up
            with contextlib.suppress(Exception):
                await self._write_json(writer, exc.status, exc.body())
        finally:
            if task is not None:
                self._connections.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _read(self, reader: asyncio.StreamReader) -> Request | None:
        line = await reader.readline()
        if not line:
            return None
        try:
            method, target, _ = line.decode("latin-1").split(" ", 2)
        except ValueError:
            raise HttpError(400, f"malformed request line {line[:80]!r}") from None
        headers: dict[str, str] = {}
        while True:
            raw = await reader.readline()
            if raw in (b"\r\n", b"\n", b""):
                break
            name, _, value = raw.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise HttpError(411, "chunked request bodies are not supported: send Content-Length")
        length = int(headers.get("content-length") or 0)
        if length > self.max_body:
            raise HttpError(413, f"the request body is {length} bytes: at most {self.max_body}")
        body = await reader.readexactly(length) if length else b""
        return Request(method.upper(), target.split("?", 1)[0], headers, body)

    async def _answer(self, request: Request, writer: asyncio.StreamWriter) -> None:
        handler = self.routes.get((request.method, request.path.rstrip("/") or "/"))
        try:
            if handler is None:
                known = sorted({p for _, p in self.routes})
                raise HttpError(404, f"{request.method} {request.path}: not a route ({known})")
            result = await handler(request)
        except HttpError as exc:
            await self._write_json(writer, exc.status, exc.body())
            return
        except Exception as exc:  # a bug or an engine failure: named, the server lives on
            log.exception("policy server: %s %s failed", request.method, request.path)
            error = HttpError(500, f"{type(exc).__name__}: {exc}", "server_error")
            await self._write_json(writer, 500, error.body())
            return
        if isinstance(result, StreamResponse):
            await self._write_stream(writer, result)
        else:
            await self._write_json(writer, result.status, result.body)

    @staticmethod
    async def _write_json(writer: asyncio.StreamWriter, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        writer.write(head.encode() + data)
        await writer.drain()

    @staticmethod
    async def _write_stream(writer: asyncio.StreamWriter, stream: StreamResponse) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
        )

        def chunk(data: bytes) -> bytes:
            return f"{len(data):x}\r\n".encode() + data + b"\r\n"

        async for event in stream.events:
            writer.write(chunk(f"data: {json.dumps(event)}\n\n".encode()))
            await writer.drain()
        writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()

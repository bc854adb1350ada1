"""The benchmarks' HTTP client for posting telemetry as fast as the service takes it."""

from __future__ import annotations

import asyncio


class LeanClient:
    """Requests over kept-alive HTTP/1.1 connections to one base URL, for the phases that
    are measured (enrolment, telemetry).

    httpx costs more CPU per small request than the service does to handle it: profiled with
    py-spy during 16-window batches, the simulator took 88 % of a core and `serve` 56 %, so the
    rate measured was the client's. This speaks just enough HTTP/1.1 (Content-Length bodies,
    keep-alive) to leave the cores to the service."""

    def __init__(self, base: str, size: int) -> None:
        host, _, port = base.removeprefix("http://").partition(":")
        self._host, self._port, self._size = host, int(port), size
        self._idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
        self._idle = asyncio.Queue()
        self._open = 0

    async def _acquire(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._idle.empty() and self._open < self._size:
            self._open += 1
            try:
                return await asyncio.open_connection(self._host, self._port)
            except BaseException:
                self._open -= 1
                raise
        return await self._idle.get()

    async def post(self, path: str, body: bytes, token: str | None) -> tuple[int, bytes]:
        return await self.request("POST", path, body, token)

    async def request(
        self, method: str, path: str, body: bytes, token: str | None
    ) -> tuple[int, bytes]:
        """One request with a JSON body (and the bearer token, if any): status and body."""
        reader, writer = await self._acquire()
        try:
            authorization = f"Authorization: Bearer {token}\r\n" if token else ""
            head = (
                f"{method} {path} HTTP/1.1\r\nHost: {self._host}\r\n{authorization}"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            writer.write(head.encode() + body)
            status = int((await reader.readline()).split()[1])
            length, close = 0, False
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.lower() == "content-length":
                    length = int(value)
                elif name.lower() == "connection" and value.strip().lower() == "close":
                    close = True
            reply = await reader.readexactly(length)
        except BaseException:
            writer.close()
            self._open -= 1
            raise
        if close:
            writer.close()
            self._open -= 1
        else:
            self._idle.put_nowait((reader, writer))
        return status, reply

    async def aclose(self) -> None:
        while not self._idle.empty():
            _, writer = self._idle.get_nowait()
            writer.close()
            await writer.wait_closed()

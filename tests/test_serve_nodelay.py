"""Each connection of a multi-process server sends without Nagle's delay (serve/nodelay.py)."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

uvicorn = pytest.importorskip("uvicorn")


async def _two_writes(scope, receive, send):
    """A response in two writes, as every JSON answer goes out: its head, then its body."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _served_sockets(http: str) -> list[int]:
    """TCP_NODELAY of the server's side of one connection, on a listening socket made as
    uvicorn makes it for ``--workers N`` (``socket.socket(family=AF_INET)``: protocol 0)."""
    listening = socket.socket(family=socket.AF_INET)
    listening.bind(("127.0.0.1", 0))
    assert listening.proto == 0
    port = listening.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_two_writes, http=http, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        with httpx.Client() as client:  # one keep-alive connection, open while we look
            assert client.get(f"http://127.0.0.1:{port}/").text == "ok"
            return [c.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP,
                                                                    socket.TCP_NODELAY)
                    for c in server.server_state.connections]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        listening.close()


def test_each_connection_has_nagle_off_whatever_the_listening_socket_says():
    from dicosa.serve import nodelay

    options = _served_sockets(nodelay.PATH)
    assert len(options) == 1 and options[0] != 0

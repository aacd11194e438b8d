"""uvicorn's HTTP protocol with Nagle's algorithm off on every connection (``TCP_NODELAY``).

A response goes out in more than one write (its head, then its body). With Nagle's algorithm
on, the second small write waits until the client acknowledges the first, and a client
delays that acknowledgement by up to ~40 ms hoping to piggyback it: a search that took 35 ms
in the server reached a lone client after ~80 ms. asyncio turns the algorithm off for the
connections of a server it binds itself, but only where the listening socket names its
protocol (``IPPROTO_TCP``), and the socket uvicorn binds for ``--workers N`` says 0, so
every connection of a multi-process server kept it. This protocol sets the option on each
connection whatever the listening socket says, and is otherwise uvicorn's own (``auto``:
httptools where installed, else h11).
"""

from __future__ import annotations

import asyncio
import socket

from uvicorn.protocols.http.auto import AutoHTTPProtocol

__all__ = ["PATH", "NoDelayHTTP"]

PATH = f"{__name__}:NoDelayHTTP"  # for uvicorn's ``http=``, resolved in each worker


class NoDelayHTTP(AutoHTTPProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)

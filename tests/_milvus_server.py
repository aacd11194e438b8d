"""A Milvus standalone server for the tests, from the ``milvus`` package (2.3.5).

The wheel ships the Milvus binary with embedded etcd and local storage (Linux x86-64 only);
:class:`StandaloneServer` runs it in a folder of its own on free ports, and can SIGKILL it and
start it again on the same folder and ports (the fault tests).

The embedded etcd would listen on etcd's default ports (2379, 2380) whatever the config's
``etcd_port`` says, so two servers on one machine collide: it gets a config file of its own
(``etcd.config.path``) with free ports.

``fast=True`` makes the server's query coordinator look for new segments and indexes every
second (``queryCoord.updateNextTargetInterval``, ``checkHandoffInterval``, ...): a flushed
segment is then loaded, and its index handed to the query node, within 1-3 s instead of 15-20 s
each with the shipped settings; and the sessions of a
killed server's components expire after 10 s instead of 30 s (until then a restarted server
waits for them before it serves the collection again). The states a segment goes through
(growing, sealed without index, indexed) are the same; only the waits are shorter.
The benchmark runs the server with its shipped settings.
"""

from __future__ import annotations

import os
import platform
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

from tests._launch import exec_with

SUPPORTED = sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")
WHY_NOT = "the milvus package's server binary runs on Linux x86-64 only"

# Lines added under queryCoord in the shipped config template (keys it does not list).
FAST_SETTINGS = ("  updateNextTargetInterval: 1\n  checkHandoffInterval: 1000\n"
                 "  checkIndexInterval: 1000\n  checkSegmentInterval: 1000\n")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _bind(port: int) -> socket.socket | None:
    """A listening socket on ``port`` (SO_REUSEADDR: a killed server leaves TIME_WAIT
    connections on its ports, which the package's own check would take for a busy port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        return sock
    except OSError:
        sock.close()
        return None


class StandaloneServer:
    """One Milvus standalone process in ``base_dir``, serving gRPC on ``uri``."""

    def __init__(self, base_dir: str | os.PathLike, *, fast: bool = True,
                 start_timeout: float = 180.0) -> None:
        from milvus import MilvusServer, MilvusServerConfig

        class Config(MilvusServerConfig):
            try_bind_port = staticmethod(_bind)

        self.base_dir = Path(base_dir)
        config = Config(data_dir=str(self.base_dir))
        # Every port chosen now, kept across restarts (the URI stays the same).
        self.ports = {key: free_port() for key in config.configurable_items
                      if key.endswith("_port")}
        config.update(**self.ports)
        etcd_config = self.base_dir / "embed_etcd.yaml"
        self.base_dir.mkdir(parents=True, exist_ok=True)
        etcd_config.write_text(_embedded_etcd(free_port(), free_port()))
        config.template_text = _inject(config.template_text, "etcd",
                                       f"  config:\n    path: {etcd_config}\n")
        if fast:
            config.template_text = _inject(config.template_text, "queryCoord", FAST_SETTINGS)
            config.set("common.session.ttl", 10)
        self.server = MilvusServer(config, wait_for_started=False)
        self.server.webservice_port = free_port()
        self.start_timeout = start_timeout

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.ports['proxy_port']}"

    @property
    def pid(self) -> int:
        return self.server.server_proc.pid

    def start(self) -> StandaloneServer:
        """Start (or restart, on the same folder and ports) and wait until healthy. The
        server dies with this process (a killed test run leaves no server behind)."""
        import milvus

        spawn = subprocess.Popen  # the patch below replaces the module's own attribute

        def popen(command, **kwargs):
            return spawn(exec_with(command, kill_with_parent=True), **kwargs)

        with mock.patch.object(milvus.subprocess, "Popen", popen):
            self.server.start()
        self.server.wait_started(timeout=int(self.start_timeout * 1000))
        return self

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye to etcd."""
        proc = self.server.server_proc
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        self.server.server_proc = None
        for fd in self.server.proc_fds.values():
            fd.close()
        self.server.proc_fds.clear()

    def stop(self) -> None:
        """The end of a test server, whose data are thrown away: SIGKILL (a graceful stop
        takes Milvus 20 s and more)."""
        if self.server.server_proc is not None:
            self.kill()


def _inject(template: str, section: str, lines: str) -> str:
    """``template`` with ``lines`` (indented YAML) added under its top-level ``section``."""
    assert f"\n{section}:\n" in template, section
    return template.replace(f"\n{section}:\n", f"\n{section}:\n{lines}", 1)


def _embedded_etcd(client_port: int, peer_port: int) -> str:
    client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    return (f"name: default\nlisten-client-urls: {client}\nadvertise-client-urls: {client}\n"
            f"listen-peer-urls: {peer}\ninitial-advertise-peer-urls: {peer}\n"
            f"initial-cluster: default={peer}\n")


def wait_until(condition, timeout: float, step: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return condition()

"""Test helper: a real Ray cluster of one or more nodes on this machine, all of it ours.

Each node is ``ray start --block`` in a process of our own (the node's Ray processes are its
children, and the workers theirs), in a temporary folder of its own, with every port it
listens on picked free, so that it never meets another Ray instance of the machine.
:meth:`Cluster.stop` ends the nodes' processes by their ids, nothing else. Token
authentication is off for these clusters (they listen on 127.0.0.1 only, for one test
module): the tests' drivers get the same setting through :attr:`Cluster.env`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ._ranks import free_port

REPO = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).parent / "ray")
_STORE_BYTES = 150 * 2**20  # each node's object store


@dataclass
class Cluster:
    temp: Path
    port: int
    nodes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """The environment for this cluster's nodes and for the drivers that use it."""
        return dict(os.environ, PYTHONPATH=str(REPO), RAY_AUTH_MODE="disabled",
                    OMP_NUM_THREADS="1", RAY_USAGE_STATS_ENABLED="0")

    def add_node(self, cpus: int, resources: dict | None = None) -> None:
        """Start a node (the head if it is the first) and wait until the cluster has it."""
        head = not self.nodes
        where = (["--head", "--port", str(self.port), "--ray-client-server-port",
                  str(free_port()), "--dashboard-port", str(free_port()),
                  "--include-dashboard", "false"] if head
                 else ["--address", self.address])
        command = [RAY, "start", "--block", *where, "--node-ip-address", "127.0.0.1",
                   "--num-cpus", str(cpus), "--temp-dir", str(self.temp),
                   "--object-store-memory", str(_STORE_BYTES), "--disable-usage-stats",
                   "--resources", json.dumps(resources or {}),
                   *[arg for name in ("--dashboard-agent-listen-port",
                                      "--dashboard-agent-grpc-port", "--metrics-export-port",
                                      "--runtime-env-agent-port")
                     for arg in (name, str(free_port()))]]
        log = open(self.temp / f"node-{len(self.nodes)}.log", "w")  # noqa: SIM115
        self.nodes.append(subprocess.Popen(command, env=self.env, stdout=log,
                                           stderr=subprocess.STDOUT))
        self._wait_for(len(self.nodes))

    def _wait_for(self, count: int, timeout: float = 120.0) -> None:
        probe = (f"import ray; ray.init(address={self.address!r}, log_to_driver=False); "
                 "print(sum(n['Alive'] for n in ray.nodes()))")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(node.poll() is not None for node in self.nodes):
                raise RuntimeError(f"a Ray node exited; see {self.temp}/node-*.log")
            done = subprocess.run([sys.executable, "-c", probe], env=self.env, text=True,
                                  capture_output=True, timeout=60)
            if done.returncode == 0 and done.stdout.strip() == str(count):
                return
            time.sleep(1.0)
        raise TimeoutError(f"the Ray cluster did not reach {count} node(s)")

    def processes(self) -> list[psutil.Process]:
        """Every live process of this cluster: the nodes and all their descendants."""
        found = []
        for node in self.nodes:
            with contextlib.suppress(psutil.NoSuchProcess):
                parent = psutil.Process(node.pid)
                found += [parent, *parent.children(recursive=True)]
        return found

    def workers(self, title: str = "ray::") -> list[psutil.Process]:
        """This cluster's worker processes whose title starts with ``title``."""
        out = []
        for process in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess, IndexError):
                if process.cmdline()[0].startswith(title):  # Ray sets a worker's title
                    out.append(process)
        return out

    def stop(self) -> None:
        """End every process of the cluster (SIGTERM to each node, then SIGKILL to what is
        left), by id, and delete its folder."""
        every = self.processes()
        for node in self.nodes:
            with contextlib.suppress(ProcessLookupError):
                node.send_signal(signal.SIGTERM)
        for node in self.nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.wait(timeout=5)
        for process in every:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        for node in self.nodes:
            node.wait()
        shutil.rmtree(self.temp, ignore_errors=True)


def start_cluster(*cpus: int, resources: list[dict] | None = None) -> Cluster:
    """A cluster of ``len(cpus)`` nodes, node i with ``cpus[i]`` CPUs (and ``resources[i]``).
    The folder is short: Ray's socket paths inside it must stay under 108 bytes."""
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="dr-", dir="/tmp")), free_port())
    try:
        for i, count in enumerate(cpus):
            cluster.add_node(count, (resources or [{}] * len(cpus))[i])
    except BaseException:
        cluster.stop()
        raise
    return cluster

"""Where a server's time goes during a load: CPU seconds of the server and of the clients,
and (optionally) py-spy's samples of the server's Python stacks.

:class:`Window` is started and stopped at the edges of a measured window. It reads the CPU
time (user + system, ``/proc/PID/stat``) of the server process, of its child processes (the
rankers of ``dicosa serve --rankers N``) and of this process (the load's client threads), so
that the clients' share of the machine is a figure beside the server's. With ``profile`` it
runs ``py-spy record`` on the server (and its children) for the window and summarises the
samples: the functions most often on the CPU (``self``: the innermost Python frame, which is
where a torch call's C++ time is counted; ``total``: every sample a function was on the
stack for), and the share of samples inside each stage of a search (:data:`STAGES`).
py-spy samples without pausing the server (``--nonblocking``), at ``rate`` Hz; figures of a
profiled run are still slower than an unprofiled one, and are not the ones to report.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

# A search's stages, as the function (py-spy's qualified name) and file each runs in: the
# share of samples in which that function is on the stack.
STAGES = {
    "encode": ("QueryText.encode", "dicosa/search/query_text.py"),
    "first_stage": ("Searcher.candidates", "dicosa/index/searcher.py"),
    "rerank": ("Searcher.rerank", "dicosa/index/searcher.py"),
    "top": ("top_hits", "dicosa/index/hits.py"),
    "moments": ("Engine.timelines", "dicosa/serve/engine.py"),
    "answer": ("Engine.answer", "dicosa/serve/engine.py"),
    "json": ("_JSON.render", "dicosa/serve/app.py"),
}
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Window:
    """CPU seconds and py-spy samples of a server between :meth:`start` and :meth:`stop`."""

    def __init__(self, server_pid: int, profile: bool = False, rate: int = 100,
                 native: bool = False, raw: Path | None = None):
        self.server_pid, self.profile, self.rate, self.native = server_pid, profile, rate, native
        self.raw = raw
        self._spy: subprocess.Popen | None = None
        self._start: dict | None = None
        self.result: dict = {}

    def _pids(self) -> list[int]:
        return [self.server_pid, *children(self.server_pid)]

    def _cpu(self) -> dict:
        return {"at": time.perf_counter(), "server": sum(cpu_seconds(p) for p in self._pids()),
                "clients": cpu_seconds(os.getpid())}

    def start(self) -> None:
        self._start = self._cpu()
        if self.profile:
            self._spy = _start_py_spy(self.server_pid, self.rate, self.native, self.raw)

    def stop(self) -> None:
        if self._start is None:
            return
        end = self._cpu()
        seconds = end["at"] - self._start["at"]
        self.result["cpu"] = {
            "window_s": round(seconds, 2), "cores": os.cpu_count(),
            "server_s": round(end["server"] - self._start["server"], 2),
            "clients_s": round(end["clients"] - self._start["clients"], 2),
            "how": "user + system CPU seconds in the window (/proc/PID/stat): the server "
                   "and its worker processes; this process's client threads"}
        if self._spy is not None:
            self.result["profile"] = _finish_py_spy(self._spy, self.raw)


def _start_py_spy(pid: int, rate: int, native: bool, raw: Path | None) -> subprocess.Popen:
    spy = shutil.which("py-spy", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                       os.environ.get("PATH", "")]))
    if spy is None:
        raise SystemExit("--profile needs py-spy: pip install py-spy (in dicosa[dev])")
    assert raw is not None
    command = [spy, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw",
               "--output", str(raw), "--nonblocking", "--subprocesses"]
    if native:
        command.append("--native")
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _finish_py_spy(spy: subprocess.Popen, raw: Path) -> dict:
    """Stop py-spy (SIGINT makes it write what it sampled) and summarise its samples."""
    spy.send_signal(2)
    try:
        said, _ = spy.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        spy.kill()
        said, _ = spy.communicate()
    if not raw.is_file():
        return {"error": (said or "py-spy wrote nothing").strip()[-500:]}
    return {**summarise(raw.read_text()), "raw": str(raw)}


def summarise(raw: str, top: int = 25) -> dict:
    """py-spy's raw (collapsed) stacks -> the busiest functions and each stage's share."""
    own, total, stages, samples = Counter(), Counter(), Counter(), 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_name(f) for f in stack.split(";")]
        n = int(count)
        samples += n
        own[frames[-1]] += n
        for name in set(frames):
            total[name] += n
        for stage, (function, path) in STAGES.items():
            if f"{function} ({path})" in frames:
                stages[stage] += n

    def shares(counter: Counter) -> list[dict]:
        return [{"function": name, "share": round(n / samples, 4)}
                for name, n in counter.most_common(top)]

    return {"samples": samples, "stages": {k: round(stages[k] / max(samples, 1), 4)
                                           for k in STAGES},
            "top_self": shares(own), "top_total": shares(total),
            "how": "py-spy record --nonblocking --subprocesses (busy samples only); share = "
                   "samples with the function innermost (self) or anywhere on the stack "
                   "(total) / all samples"}


def _name(frame: str) -> str:
    """``function (path:line)`` -> ``function (path)``, the path from ``dicosa/`` or the
    package folder on."""
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    path = match["file"]
    for marker in ("dicosa/", "site-packages/", "lib/python"):
        if marker in path:
            path = path[path.index(marker):].removeprefix("site-packages/")
            break
    return f"{match['function']} ({path})"

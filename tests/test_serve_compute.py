"""The service's compute thread: every search, page and reopening on one thread (why:
dicosa/serve/compute.py), the calls' results and errors as if made in place."""

from __future__ import annotations

import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient

from dicosa.serve.app import Service, Settings, create_app
from dicosa.serve.compute import SWITCH_INTERVAL_S, ComputeThread
from dicosa.serve.engine import Engine

from .test_serve_api import REPO, built  # noqa: F401  (built: the module's index fixture)


def test_calls_run_on_one_other_thread_in_order_with_their_errors():
    before = torch.get_num_threads()
    try:
        _runs_on_one_thread(ComputeThread(threads=before + 1))
    finally:
        torch.set_num_threads(before)  # torch's count is the process's


def _runs_on_one_thread(compute: ComputeThread) -> None:
    here = threading.get_ident()
    with ThreadPoolExecutor(8) as callers:  # many request threads at once
        seen = list(callers.map(lambda i: compute.run(lambda: (threading.get_ident(), i)),
                                range(64)))
    assert {ident for ident, _ in seen} != {here} and len({ident for ident, _ in seen}) == 1
    assert [i for _, i in seen] == list(range(64))
    # a call made on the thread itself runs at once instead of waiting for itself
    assert compute.run(lambda: compute.run(lambda: 7) + 1) == 8
    with pytest.raises(ZeroDivisionError):
        compute.run(lambda: 1 / 0)
    assert compute.run(lambda: "still serving") == "still serving"
    compute.close()


def test_torch_runs_the_threads_asked_there_and_one_thread_runs_inline():
    before = torch.get_num_threads()
    try:
        compute = ComputeThread(threads=before + 1)
        assert not compute.inline and compute.run(torch.get_num_threads) == before + 1
        compute.close()
    finally:
        torch.set_num_threads(before)  # torch's count is the process's
    alone = ComputeThread(threads=1)  # no teams to keep apart: the caller's thread
    assert alone.inline and alone.run(threading.get_ident) == threading.get_ident()


def test_a_service_process_sets_its_torch_threads_and_a_short_gil_switch_interval():
    threads, interval = torch.get_num_threads(), sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)  # CPython's default
        compute = ComputeThread.for_process(threads + 1)
        assert torch.get_num_threads() == threads + 1 == compute.threads
        assert SWITCH_INTERVAL_S < 0.005
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
        compute.close()
    finally:
        torch.set_num_threads(threads)  # both are the process's
        sys.setswitchinterval(interval)


def test_the_service_searches_cuts_pages_and_reopens_on_its_compute_thread(built,  # noqa: F811
                                                                          monkeypatch):
    before = torch.get_num_threads()
    compute = ComputeThread(threads=max(2, before))  # a thread of its own
    try:
        _served_on(compute, built, monkeypatch)
    finally:
        compute.close()
        torch.set_num_threads(before)


def _served_on(compute: ComputeThread, built, monkeypatch) -> None:  # noqa: F811
    engine = compute.run(Engine.open, built)
    where: dict[str, set[str]] = {}

    def watched(name, method):
        def call(*args, **kwargs):
            where.setdefault(name, set()).add(threading.current_thread().name)
            return method(*args, **kwargs)
        return call

    for name in ("rank", "answer", "similar", "reopen"):
        monkeypatch.setattr(engine, name, watched(name, getattr(engine, name)))
    service = Service(engine, reload_interval_s=0)
    for batch in (8, 1):
        app = create_app(service, Settings(reload_interval_s=0, max_batch=batch), compute)
        with TestClient(app) as client:
            assert client.get("/api/search", params={"q": "a red circle"}).status_code == 200
            first = client.get("/api/search", params={"q": "a bar"}).json()["hits"][0]["id"]
            assert client.get(f"/api/videos/{first}/similar").status_code == 200
    monkeypatch.setattr(engine, "changed", lambda: True)
    assert service.check_reload()  # the watcher asks; the compute thread opens
    assert set(where) == {"rank", "answer", "similar", "reopen"}
    assert all(names == {"dicosa-compute_0"} for names in where.values()), where


def test_a_frozen_heap_is_left_out_of_collections_until_given_back():
    """freeze_heap: what the process held is not collected (never walked) until the next
    freeze_heap(again=True) gives it back; run in a process of its own, as a service does."""
    code = "\n".join([
        "import gc, weakref",
        "from dicosa.serve.compute import freeze_heap",
        "class Node: pass",
        "held = Node(); held.me = held  # a reference cycle, as an index's objects may hold",
        "alive = weakref.ref(held)",
        "freeze_heap()",
        "assert gc.get_freeze_count() > 1000",
        "del held",
        "gc.collect()",
        "assert alive() is not None, 'a frozen cycle was collected'",
        "freeze_heap(again=True)",
        "assert alive() is None, 'a cycle given back was not collected'",
        "print('ok')"])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_service_process_keeps_the_buffers_a_search_frees():
    """keep_freed_buffers: a freed 40 MiB buffer (above any threshold glibc reaches by itself)
    is reused by the next one instead of being mapped and faulted in again; each way in a
    process of its own, as a service sets it."""
    code = "\n".join([
        "import resource, sys, numpy as np",
        "from dicosa.serve.compute import keep_freed_buffers",
        "kept = keep_freed_buffers() if sys.argv[1] == 'keep' else None",
        "def faults():",
        "    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt",
        "    buffer = np.ones(10 << 20, np.float32)  # every page written",
        "    del buffer",
        "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before",
        "faults()",
        "print(kept, sum(faults() for _ in range(4)))"])
    said = {}
    for how in ("keep", "default"):
        done = subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True,
                              cwd=REPO, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        kept, count = done.stdout.split()
        said[how] = (kept, int(count))
    if said["keep"][0] != "True":
        pytest.skip("not glibc: this malloc's thresholds cannot be set")
    assert said["default"][1] > 100  # mapped anew, its pages faulted in, each time
    assert said["keep"][1] < said["default"][1] / 20

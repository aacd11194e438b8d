"""Where the service ranks its searches, picked from the machine (dicosa/serve/topology.py),
and what every process opens (dicosa/serve/spec.py)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from dicosa.serve.machine import anonymous_bytes, available_bytes, cores
from dicosa.serve.spec import TIMELINE_ROWS, EngineSpec
from dicosa.serve.topology import RANKERS, Topology, choose

GIB = 1 << 30


def _machine(**given):
    """choose() on a 2-core CPU with 16 GiB available, the server holding 1.5 GiB."""
    facts = {"rankers": None, "threads": None, "device": "cpu", "cores": 2,
             "available": 16 * GIB, "held": GIB * 3 // 2}
    return choose(**{**facts, **given})


def test_two_cores_with_memory_to_spare_get_two_rankers_of_one_thread():
    picked = _machine()
    assert (picked.rankers, picked.threads, picked.alone_threads) == (RANKERS, 1, 2) == (2, 1, 2)
    assert picked.chosen == "machine" and picked.server_threads == 1
    assert picked.why.startswith("2 ranker processes: 2 CPU cores, 16.0 GiB available, ~1.5 "
                                 "GiB each")


def test_more_cores_keep_two_rankers_each_on_half_of_them():
    picked = _machine(cores=16)
    assert (picked.rankers, picked.threads, picked.alone_threads) == (2, 8, 16)


@pytest.mark.parametrize(("given", "why"), [
    ({"device": "cuda:0"}, "this process: searches run on cuda:0"),
    ({"cores": 1}, "this process: 1 CPU core"),
    ({"available": 0}, "this process: the memory available could not be read"),
    ({"held": 0}, "this process: the memory available could not be read"),
    # 2 rankers of 4.5 GiB each need twice 9 GiB: 16 is not enough
    ({"held": 9 * GIB // 2}, "this process: 2 ranker processes would hold ~9.0 GiB (twice "
                             "that while they reopen the index), 16.0 GiB is available"),
])
def test_one_process_where_the_machine_does_not_support_rankers(given, why):
    picked = _machine(**given)
    assert picked.rankers == 0 and picked.chosen == "machine" and picked.why.startswith(why)
    assert picked.threads is None and picked.server_threads is None  # torch's default


def test_the_memory_bound_is_twice_what_the_rankers_hold():
    held = 4 * GIB
    assert _machine(held=held, available=2 * RANKERS * held).rankers == RANKERS
    assert _machine(held=held, available=2 * RANKERS * held - 1).rankers == 0


def test_options_are_taken_as_given():
    assert _machine(rankers=0, threads=3) == Topology(0, 3, None, "options",
                                                      "this process, as --rankers 0 says")
    given = _machine(rankers=3, cores=1, available=0)  # even where it would pick otherwise
    assert (given.rankers, given.threads, given.alone_threads, given.chosen) == (3, 1, 1,
                                                                               "options")
    assert given.why == "3 ranker processes, as --rankers 3 says"
    assert _machine(threads=4).threads == 4  # --threads: each ranker's while another is busy
    assert _machine(cores=1, threads=4).threads == 4  # and the one process's


def test_the_machine_is_read():
    assert cores() >= 1 and available_bytes() > 0 and anonymous_bytes() > 0


def test_an_engine_spec_is_frozen_picklable_and_has_the_services_defaults(tmp_path):
    spec = EngineSpec(tmp_path, media_roots=[tmp_path / "videos"])
    assert spec.index == str(tmp_path) and spec.media_roots == (str(tmp_path / "videos"),)
    assert (spec.text_tower, spec.query_cache, spec.timeline_rows, spec.populate) == (
        "auto", 1024, TIMELINE_ROWS, False)
    assert pickle.loads(pickle.dumps(spec)) == spec  # as a ranker process receives it
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.text_tower = "float"

"""``make test``'s first step on a machine without the Debian programs, shown by hiding them.

Nothing is uninstalled: each process runs with a ``PATH`` that finds none of the programs
(Chromium, chromedriver, Tesseract, espeak-ng), which is how ``tests/_system.py`` and the
tests' skip marks look for them. The fonts stay (a file, not a program).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ._system import NEEDS

REPO = Path(__file__).resolve().parents[1]
SYSTEM = REPO / "tests" / "_system.py"
HIDDEN = ("chromium", "chromedriver", "tesseract", "espeak-ng")


def _bare_path(tmp_path: Path, **programs: str) -> str:
    """A PATH of one folder holding only ``programs`` (name: shell script)."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name, script in programs.items():
        (folder / name).write_text(f"#!/bin/sh\n{script}\n")
        (folder / name).chmod(0o755)
    return str(folder)


def _run(args: list[str], path: str, tmp_path: Path, **env: str):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600,
                          cwd=REPO, env={**os.environ, "PATH": path, **env})


def test_without_the_programs_it_says_which_tests_will_not_run(tmp_path):
    done = _run([str(SYSTEM), "install"], _bare_path(tmp_path), tmp_path,
                DICOSA_SYSTEM_PACKAGES="never")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 4  # chromium, chromedriver, tesseract, espeak-ng; the fonts are here
    for line, name in zip(lines, HIDDEN, strict=True):
        need = NEEDS[name]
        assert line == (f"system packages: {need.name} is not installed (Debian: "
                        f"{' '.join(need.packages)}): {need.tests} will not run "
                        "(DICOSA_SYSTEM_PACKAGES=never)")


@pytest.mark.skipif(os.geteuid() != 0, reason="installs as root only (sudo otherwise)")
def test_as_root_it_installs_what_is_missing_with_apt_get(tmp_path):
    """A stand-in apt-get that records its arguments (and installs nothing): update, then one
    install of every missing package; what is still missing after it is said."""
    log = tmp_path / "apt.log"
    path = _bare_path(tmp_path, **{"apt-get": f'echo "$*" >> {log}'})
    done = _run([str(SYSTEM), "install"], path, tmp_path)
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == [
        "update -q", "install -y -q chromium chromium-driver espeak-ng tesseract-ocr "
                     "tesseract-ocr-eng"]
    assert done.stdout.splitlines()[0] == ("system packages: installing chromium "
                                           "chromium-driver espeak-ng tesseract-ocr "
                                           "tesseract-ocr-eng with apt-get")
    assert done.stdout.count("(still missing after apt-get)") == 4


def test_the_run_says_before_and_after_what_it_did_not_run(tmp_path):
    """pytest with the programs hidden: the tests that need them are skipped with the reason,
    and the run says at its start and in its summary which tests did not run and why."""
    done = _run(["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                 "tests/test_text_sources.py", "-k", "burnt_in_text or speech_is_transcribed"],
                _bare_path(tmp_path), tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    head, _, summary = done.stdout.partition("not run on this machine")
    assert "not run here: espeak-ng is not installed (Debian: espeak-ng)" in head
    assert "not run here: tesseract is not installed" in head
    assert "espeak-ng is not installed (Debian: espeak-ng): the speech tests" in summary
    assert "2 skipped" in summary and "tesseract not installed (Debian: apt-get install " \
        "tesseract-ocr tesseract-ocr-eng" in done.stdout


def test_the_text_benchmark_skips_a_cost_whose_program_is_missing(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import text_sources
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    monkeypatch.setenv("PATH", _bare_path(tmp_path))
    speech = text_sources.speech_cost(tmp_path, 2)
    ocr = text_sources.ocr_cost(tmp_path, 2)
    assert speech == {"skipped": "espeak-ng not installed (Debian: apt-get install espeak-ng; "
                                 "make test installs it where it may)"}
    assert ocr["skipped"].startswith("tesseract not installed")
    assert not list(tmp_path.glob("*.mp4"))  # nothing was made for them

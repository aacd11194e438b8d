"""The Debian packages some tests need, which tests go without each, and their installation.

Most of the suite needs only PyPI. A few tests drive programs from Debian: Chromium and its
driver (the page in a real browser), Tesseract (on-screen text), espeak-ng (speech to
transcribe) and the DejaVu fonts (text drawn into test videos). Where one is missing those
tests are skipped with the reason, and this module says so once at the start of a run and
again in its summary, so that a green run on a machine without them does not pass for one
that ran everything.

``python tests/_system.py install`` (the first step of ``make test``) installs what is
missing with apt-get where this process may (root, or passwordless sudo), and says which
tests will not run where it cannot. ``DICOSA_SYSTEM_PACKAGES=never`` leaves the system
alone. A program counts as present where ``PATH`` finds it, so a ``PATH`` without it shows
what a machine without the package runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NEEDS", "missing", "needs", "not_run", "reason"]

FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf")


@dataclass(frozen=True)
class Need:
    """Something from Debian the suite uses: found by ``programs`` on PATH (any one) or by
    ``file``; installed with ``packages``; without it, ``tests`` do not run."""

    name: str
    packages: tuple[str, ...]
    tests: str
    programs: tuple[str, ...] = ()
    file: Path | None = None

    def found(self) -> str | None:
        """Where it is (a program's path, the file), or None."""
        for program in self.programs:
            if where := shutil.which(program):
                return where
        return str(self.file) if self.file is not None and self.file.is_file() else None


BROWSER = "the browser tests (tests/test_serve_browser.py)"
NEEDS = {
    "chromium": Need("chromium", ("chromium",), BROWSER, programs=("chromium",
                                                                   "chromium-browser")),
    "chromedriver": Need("chromedriver", ("chromium-driver",), BROWSER,
                         programs=("chromedriver",)),
    "tesseract": Need("tesseract", ("tesseract-ocr", "tesseract-ocr-eng"),
                      "the OCR tests (tests/test_text_sources.py, tests/test_text_real.py, "
                      "the Ray job's in tests/test_index_ray.py), benchmarks/ocr.py and "
                      "benchmarks/text_sources.py's OCR cost",
                      programs=("tesseract",)),
    "espeak-ng": Need("espeak-ng", ("espeak-ng",),
                      "the speech tests (tests/test_text_sources.py, tests/test_text_search.py) "
                      "and benchmarks/text_sources.py's speech cost", programs=("espeak-ng",)),
    "fonts": Need("DejaVu fonts", ("fonts-dejavu-core",),
                  "the OCR tests, which draw text into videos (tests/test_text_sources.py), "
                  "and benchmarks/text_sources.py's OCR cost", file=FONT),
}


def missing() -> list[Need]:
    return [need for need in NEEDS.values() if need.found() is None]


def reason(*names: str) -> str | None:
    """Why a test that needs ``names`` cannot run here (None: it can)."""
    lacking = [NEEDS[name] for name in names if NEEDS[name].found() is None]
    if not lacking:
        return None
    packages = " ".join(p for need in lacking for p in need.packages)
    return (f"{', '.join(n.name for n in lacking)} not installed (Debian: apt-get install "
            f"{packages}; make test installs it where it may)")


def needs(*names: str):
    """A pytest mark that skips the test, with :func:`reason`, where ``names`` are missing."""
    import pytest

    why = reason(*names)
    return pytest.mark.skipif(why is not None, reason=why or "")


def not_run() -> list[str]:
    """One line per missing thing: what it is, its package, the tests that will not run."""
    return [f"{need.name} is not installed (Debian: {' '.join(need.packages)}): {need.tests} "
            "will not run" for need in missing()]


def _may_install() -> str | None:
    """Why apt-get cannot be run here (None: it can, as root or through sudo -n)."""
    if os.environ.get("DICOSA_SYSTEM_PACKAGES") == "never":
        return "DICOSA_SYSTEM_PACKAGES=never"
    if shutil.which("apt-get") is None:
        return "there is no apt-get here (not Debian or Ubuntu)"
    if os.geteuid() != 0 and (shutil.which("sudo") is None or subprocess.run(
            ["sudo", "-n", "true"], capture_output=True).returncode != 0):
        return "this user is not root and has no passwordless sudo"
    return None


def install() -> int:
    """Install the missing packages where this process may, then say what will not run."""
    lacking = missing()
    if not lacking:
        print("system packages: every program the tests use is installed")
        return 0
    why = _may_install()
    if why is None:
        packages = sorted({p for need in lacking for p in need.packages})
        sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        print(f"system packages: installing {' '.join(packages)} with apt-get", flush=True)
        for step in (["apt-get", "update", "-q"],
                     ["apt-get", "install", "-y", "-q", *packages]):
            if subprocess.run([*sudo, *step], env=env).returncode != 0:
                why = f"'{' '.join(step)}' failed"
                break
    for line in not_run():
        print(f"system packages: {line} ({why or 'still missing after apt-get'})")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["install"]:
        sys.exit(install())
    print("\n".join(not_run()) or "every program the tests use is installed")

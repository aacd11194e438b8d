"""dicosa.progress: a bar on a terminal, plain lines anywhere else."""

import io

from tqdm import tqdm

from dicosa.progress import LogProgress, NoProgress, progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _logged(total=None, initial=0, **kwargs) -> tuple[LogProgress, io.StringIO, _Clock]:
    out, clock = io.StringIO(), _Clock()
    return LogProgress(None, total=total, desc="work", unit="video", initial=initial,
                       stream=out, clock=clock, **kwargs), out, clock


def test_a_file_gets_a_line_per_fifth_and_no_carriage_return():
    bar, out, clock = _logged(total=100)
    for second in range(100):
        clock.now = float(second + 1)  # a fifth every 20 s: each one written
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert [line.split(",")[0] for line in lines] == [
        f"work: {n}/100 video ({n}%)" for n in (20, 40, 60, 80, 100)]
    assert ", 1 video/s, 20 s" in lines[0]


def test_a_fast_loop_writes_its_last_line_only():
    out = io.StringIO()
    seen = list(progress(range(100), desc="indexing videos", unit="video", stream=out))
    assert seen == list(range(100))
    (line,) = out.getvalue().splitlines()
    assert line.startswith("indexing videos: 100/100 video (100%)")


def test_postfix_and_a_last_line_at_close_for_a_run_stopped_short():
    bar, out, clock = _logged(total=1000, initial=500)
    for step in range(105):
        clock.now = 0.1 * (step + 1)
        bar.set_postfix(loss="0.123", refresh=False)
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    # 500 -> 600 crosses 20% at 600 only; closing at 605 writes where it stopped
    assert [line.split(",")[0] for line in lines] == ["work: 600/1000 video (60%)",
                                                      "work: 605/1000 video (60%)"]
    assert lines[-1].endswith("loss=0.123")


def test_without_a_total_a_line_per_interval():
    bar, out, clock = _logged(total=None)
    for second in range(1, 181):
        clock.now = float(second)
        bar.update(2)
    bar.close()
    lines = out.getvalue().splitlines()
    assert [line.split(" video")[0] for line in lines] == ["work: 120", "work: 240",
                                                          "work: 360"]
    assert "2 video/s" in lines[0]


def test_a_terminal_gets_tqdm_and_disabled_gets_nothing():
    terminal = _Terminal()
    bar = progress(total=3, desc="x", stream=terminal)
    assert isinstance(bar, tqdm)
    bar.close()
    quiet = io.StringIO()
    off = progress(range(3), enabled=False, stream=quiet)
    assert isinstance(off, NoProgress) and list(off) == [0, 1, 2]
    off.update(5)
    off.close()
    assert quiet.getvalue() == ""

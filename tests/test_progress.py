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


def test_a_file_gets_one_line_per_tenth_and_no_carriage_return():
    out = io.StringIO()
    seen = list(progress(range(100), desc="indexing videos", unit="video", stream=out))
    assert seen == list(range(100))
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert len(lines) == 10
    assert lines[0].startswith("indexing videos: 10/100 video (10%)")
    assert lines[-1].startswith("indexing videos: 100/100 video (100%)")


def test_postfix_and_a_last_line_at_close_for_a_run_stopped_short():
    out = io.StringIO()
    with progress(total=1000, desc="training", unit="step", initial=500, stream=out) as bar:
        for _ in range(105):
            bar.set_postfix(loss="0.123", refresh=False)
            bar.update(1)
    lines = out.getvalue().splitlines()
    # 500 -> 600 crosses one tenth; closing at 605 writes where it stopped
    assert [line.split(",")[0] for line in lines] == ["training: 600/1000 step (60%)",
                                                      "training: 605/1000 step (60%)"]
    assert lines[-1].endswith("loss=0.123")


def test_without_a_total_a_line_per_interval():
    out, clock = io.StringIO(), _Clock()
    bar = LogProgress(None, total=None, desc="checking", unit="video", initial=0, stream=out,
                      every_percent=10, every_s=60, clock=clock)
    for second in range(1, 181):
        clock.now = float(second)
        bar.update(2)
    bar.close()
    lines = out.getvalue().splitlines()
    assert [line.split(" video")[0] for line in lines] == ["checking: 120", "checking: 240",
                                                          "checking: 360"]
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

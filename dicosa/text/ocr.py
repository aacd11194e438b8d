"""On-screen text: Tesseract OCR on a few frames of each row.

For a row covering ``start``..``end`` s, :func:`screen_lines` decodes ``count`` frames at the
centres of ``count`` equal parts of the range (PyAV, seeking to each) and reads each with
Tesseract (through pytesseract, which runs the ``tesseract`` program of Debian's
``tesseract-ocr`` + ``tesseract-ocr-eng``). A frame's text is a line covering its part of the
range, so its time is known to within half a part; the same text on consecutive frames of a
row is one line over their parts.

Frames whose short side is under :data:`MIN_SIDE` pixels are enlarged first (Tesseract reads
letters about 20 px high best); Tesseract segments the frame as sparse text (``--psm 11``:
captions, signs and titles anywhere on the picture), and words it is less than
:data:`MIN_CONFIDENCE` % sure of, or without a letter or digit, are dropped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from .lines import SourceReport, SourceUnavailable, TextLine

__all__ = ["MIN_CONFIDENCE", "MIN_SIDE", "frame_times", "read_frame", "screen_lines"]

MIN_SIDE = 720
MIN_CONFIDENCE = 60.0
_CONFIG = "--psm 11"


def frame_times(start: float, end: float, count: int) -> list[float]:
    """The centres of ``count`` equal parts of ``start``..``end``."""
    step = (end - start) / count
    return [start + (i + 0.5) * step for i in range(count)]


def read_frame(image) -> str:
    """The words Tesseract reads in a PIL image, in reading order, one space apart.

    Raises:
        SourceUnavailable: the ``tesseract`` program or pytesseract is not installed.
    """
    try:
        import pytesseract
    except ImportError:
        raise SourceUnavailable("pytesseract is not installed (pip install 'dicosa[text]')"
                                ) from None
    gray = image.convert("L")
    short = min(gray.size)
    if 0 < short < MIN_SIDE:
        scale = MIN_SIDE / short
        gray = gray.resize((round(gray.width * scale), round(gray.height * scale)))
    try:
        data = pytesseract.image_to_data(gray, config=_CONFIG,
                                         output_type=pytesseract.Output.DICT)
    except pytesseract.TesseractNotFoundError:
        raise SourceUnavailable("Tesseract is not installed (Debian: apt-get install "
                                "tesseract-ocr tesseract-ocr-eng)") from None
    words = [w.strip() for w, c in zip(data["text"], data["conf"], strict=True)
             if float(c) >= MIN_CONFIDENCE and any(ch.isalnum() for ch in w)]
    return " ".join(words)


def _frames_at(path: Path, times: list[float]) -> Iterator[tuple[float, object]]:
    """``(time, PIL image)`` of the first frame at or after each time (ascending)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        origin = (container.start_time or 0) / av.time_base
        for t in times:
            container.seek(int((t + origin) / stream.time_base), stream=stream,
                           backward=True)
            last = None
            for frame in container.decode(stream):
                last = frame
                if frame.pts is not None and float(frame.pts * stream.time_base) - origin >= t:
                    break
            if last is not None:
                yield t, last.to_image()


def screen_lines(video: str | Path, spans: list[tuple[float, float]], count: int
                 ) -> tuple[list[TextLine], SourceReport]:
    """The text on ``count`` frames of each span of ``video`` (module docstring).

    Raises:
        SourceUnavailable: Tesseract is not installed.
    """
    import av

    video = Path(video)
    report = SourceReport("screen", "tesseract", videos=1)
    began = time.perf_counter()
    lines: list[TextLine] = []
    for start, end in spans:
        if not end > start or end == float("inf"):
            report.skipped["rows without a known length"] += 1
            continue
        step = (end - start) / count
        read = []
        try:
            for t, image in _frames_at(video, frame_times(start, end, count)):
                read.append((t, read_frame(image)))
        except (av.FFmpegError, OSError, IndexError) as exc:
            report.skipped["videos whose frames do not decode"] += 1
            report.note(f"the frames of {video} could not be read for OCR ({exc})")
        report.frames += len(read)
        lines += _joined(video, read, step)
    report.found, report.lines = int(bool(lines)), len(lines)
    report.work_s = time.perf_counter() - began
    return lines, report


def _joined(video: Path, read: list[tuple[float, str]], step: float) -> list[TextLine]:
    """One line per run of consecutive frames reading the same text."""
    lines: list[TextLine] = []
    for t, text in read:
        if not text:
            continue
        start, end = t - step / 2, t + step / 2
        if lines and lines[-1].text == text and abs(lines[-1].end - start) < 1e-6:
            start = lines.pop().start
        lines.append(TextLine(str(video), start, end, text, "screen"))
    return lines

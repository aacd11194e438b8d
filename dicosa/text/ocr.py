"""On-screen text: Tesseract OCR on a few frames of each row, keeping only what reads as text.

For a row covering ``start``..``end`` s, :func:`screen_lines` decodes ``count`` frames at the
centres of ``count`` equal parts of the range (PyAV, seeking to each) and reads each with
Tesseract (through pytesseract, which runs the ``tesseract`` program of Debian's
``tesseract-ocr`` + ``tesseract-ocr-eng``). Each line of text on a frame is a line covering its
part of the range, so its time is known to within half a part; the same text on consecutive
frames of a row is one line over their parts.

**Reading a frame** (:func:`read_lines`). Tesseract given a whole natural picture reads its
texture as words, while text put on a video is drawn in a flat colour far lighter or darker
than what surrounds it; so the frame is read as two masks, :func:`ink_masks`: the pixels at
least :data:`BRIGHT` grey and those at most :data:`DARK`, each drawn black on white, which
keep letters whole and leave a picture's texture as a few large blobs. A mask whose ink
covers less than :data:`MIN_INK` of the frame or more than :data:`MAX_INK` is not read.
Frames whose short side is under :data:`MIN_SIDE` pixels are enlarged first; Tesseract
segments each mask as sparse text (``--psm 11``).

**What is kept** (:func:`text_lines`). A word read at least :data:`WORD_CONFIDENCE` % sure and
written as a word is (letters in one case pattern, or a number; surrounding punctuation
dropped), in a line that holds an anchor: a kept word of at least :data:`ANCHOR_LETTERS`
letters, a vowel among them, read at :data:`ANCHOR_CONFIDENCE` % or more (a line of one word
needs :data:`ALONE_LETTERS` letters). Texture read as text is short, of mixed case or unsure,
and alone; a caption has a real word in it. docs/text.md ("On-screen text") says why, what
this cannot read, and what was measured.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..data.display import shown_pixels
from .lines import SourceReport, SourceUnavailable, TextLine

__all__ = ["ALONE_LETTERS", "ANCHOR_CONFIDENCE", "ANCHOR_LETTERS", "BRIGHT", "DARK", "MAX_INK",
           "MIN_INK", "MIN_SIDE", "WORD_CONFIDENCE", "ink_masks", "read_lines", "sample_times",
           "screen_lines", "text_lines"]

MIN_SIDE = 720
BRIGHT, DARK = 200, 55  # grey levels of drawn text: at least BRIGHT, or at most DARK
MIN_INK, MAX_INK = 0.0005, 0.5  # a mask is read when its ink covers this share of the frame
WORD_CONFIDENCE = 60.0
ANCHOR_CONFIDENCE = 85.0
ANCHOR_LETTERS = 3
ALONE_LETTERS = 4  # a line of one word: its anchor's letters
_CONFIG = "--psm 11"
_EDGES = re.compile(r"^[^\w]+|[^\w]+$")
_NUMBER = re.compile(r"^\d+(?:[.,:]\d+)*%?$")
_VOWELS = set("aeiouyAEIOUY")


def sample_times(start: float, end: float, count: int) -> list[float]:
    """The centres of ``count`` equal parts of ``start``..``end``."""
    step = (end - start) / count
    return [start + (i + 0.5) * step for i in range(count)]


def ink_masks(image) -> list:
    """The masks of a PIL image that are worth reading (module docstring): its light pixels,
    then its dark ones, each as black ink on white, enlarged to :data:`MIN_SIDE`."""
    from PIL import Image

    gray = image.convert("L")
    short = min(gray.size)
    if 0 < short < MIN_SIDE:
        scale = MIN_SIDE / short
        gray = gray.resize((round(gray.width * scale), round(gray.height * scale)),
                           Image.Resampling.BICUBIC)
    pixels = np.asarray(gray)
    masks = []
    for ink in (pixels >= BRIGHT, pixels <= DARK):
        if MIN_INK <= ink.mean() <= MAX_INK:
            masks.append(Image.fromarray(np.where(ink, 0, 255).astype(np.uint8)))
    return masks


def _word(token: str) -> str | None:
    """``token`` without surrounding punctuation if it is written as a word or a number."""
    word = _EDGES.sub("", token)
    if _NUMBER.match(word):
        return word
    parts = re.split(r"['’-]", word)
    if not word or not all(p.isalpha() for p in parts):
        return None
    letters = "".join(parts)
    if letters.islower() or letters.isupper() or (letters[0].isupper()
                                                 and letters[1:].islower()):
        return word
    return None


def _anchor(word: str, confidence: float, letters_needed: int) -> bool:
    letters = [ch for ch in word if ch.isalpha()]
    return (confidence >= ANCHOR_CONFIDENCE and len(letters) >= letters_needed
            and bool(_VOWELS.intersection(letters)))


def text_lines(data: dict) -> list[str]:
    """The lines worth keeping (module docstring) of Tesseract's ``image_to_data`` dict, in
    its order."""
    grouped: dict[tuple, list[tuple[str, float]]] = {}
    columns = zip(data["text"], data["conf"], data["block_num"], data["par_num"],
                  data["line_num"], strict=True)
    for token, confidence, *line in columns:
        confidence = float(confidence)
        word = _word(str(token)) if confidence >= WORD_CONFIDENCE else None
        if word:
            grouped.setdefault(tuple(line), []).append((word, confidence))
    return [" ".join(w for w, _ in words) for words in grouped.values()
            if any(_anchor(w, c, ANCHOR_LETTERS if len(words) > 1 else ALONE_LETTERS)
                   for w, c in words)]


def read_lines(image) -> list[str]:
    """The lines of text Tesseract reads in a PIL image (module docstring), each once.

    Raises:
        SourceUnavailable: the ``tesseract`` program or pytesseract is not installed.
    """
    try:
        import pytesseract
    except ImportError:
        raise SourceUnavailable("pytesseract is not installed (pip install 'dicosa[text]')"
                                ) from None
    lines: list[str] = []
    for mask in ink_masks(image):
        try:
            data = pytesseract.image_to_data(mask, config=_CONFIG,
                                             output_type=pytesseract.Output.DICT)
        except pytesseract.TesseractNotFoundError:
            raise SourceUnavailable("Tesseract is not installed (Debian: apt-get install "
                                    "tesseract-ocr tesseract-ocr-eng)") from None
        lines += [line for line in text_lines(data) if line not in lines]
    return lines


def _frames_at(path: Path, times: list[float]) -> Iterator[tuple[float, object]]:
    """``(time, PIL image)`` of the first frame at or after each time (ascending), shown as a
    player shows it (a phone's portrait video is read the right way up)."""
    import av
    from PIL import Image

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
                yield t, Image.fromarray(np.ascontiguousarray(shown_pixels(last)))


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
            for t, image in _frames_at(video, sample_times(start, end, count)):
                read.append((t, read_lines(image)))
        except (av.FFmpegError, OSError, IndexError) as exc:
            report.skipped["videos whose frames do not decode"] += 1
            report.note(f"the frames of {video} could not be read for OCR ({exc})")
        report.frames += len(read)
        lines += _joined(video, read, step)
    report.found, report.lines = int(bool(lines)), len(lines)
    report.work_s = time.perf_counter() - began
    return lines, report


def _joined(video: Path, read: list[tuple[float, list[str]]], step: float) -> list[TextLine]:
    """One line per run of consecutive frames reading the same text."""
    lines: list[TextLine] = []
    open_: dict[str, int] = {}  # text -> its line in ``lines``, while read on every frame
    for t, texts in read:
        start, end = t - step / 2, t + step / 2
        still = {}
        for text in texts:
            at = open_.get(text)
            if at is not None and abs(lines[at].end - start) < 1e-6:
                lines[at] = TextLine(str(video), lines[at].start, end, text, "screen")
            else:
                at = len(lines)
                lines.append(TextLine(str(video), start, end, text, "screen"))
            still[text] = at
        open_ = still
    return lines

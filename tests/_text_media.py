"""Test helpers: videos that carry words: burnt-in text, speech, subtitle streams.

- :func:`write_clip` writes an mp4 of a flat background, with text drawn by Pillow in a
  DejaVu font (Debian ``fonts-dejavu-core``) over a time range, and optionally a sound track
  (int16 samples, AAC);
- :func:`say` synthesises speech with ``espeak-ng`` (Debian) as 16 kHz int16 samples;
- :func:`mux_subtitles` copies a video with a subtitle file muxed in as a stream (FFmpeg's
  binary from imageio-ffmpeg): SubRip in MKV, mov_text in MP4, WebVTT in MKV.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import av
import numpy as np

from ._system import FONT

RATE = 16000
# PocketSphinx reads espeak-ng's klatt2 variant at 140 words a minute best of the voices tried
VOICE, SPEED = "en-us+klatt2", "140"


def say(text: str) -> np.ndarray:
    """``text`` spoken by espeak-ng, as int16 samples at :data:`RATE` Hz."""
    with tempfile.TemporaryDirectory() as folder:
        wav = Path(folder) / "speech.wav"
        subprocess.run(["espeak-ng", "-v", VOICE, "-s", SPEED, "-w", str(wav), text],
                       check=True, capture_output=True)
        with av.open(str(wav)) as container:
            resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE)
            parts = [out.to_ndarray().reshape(-1) for frame in container.decode(audio=0)
                     for out in resampler.resample(frame)]
            parts += [out.to_ndarray().reshape(-1) for out in resampler.resample(None)]
    return np.concatenate(parts).astype(np.int16)


def _frame(size: tuple[int, int], text: str | None):
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", size, (20, 30, 60))
    if text:
        font = ImageFont.truetype(str(FONT), max(12, size[1] // 6))
        ImageDraw.Draw(image).text((size[0] // 16, size[1] // 3), text, font=font,
                                   fill=(250, 250, 250))
    return image


def write_clip(path: str | Path, seconds: float = 4.0, *, fps: int = 10,
               size: tuple[int, int] = (320, 180), text: tuple[str, float, float] | None = None,
               sound: np.ndarray | None = None) -> Path:
    """An mp4 (MPEG-4 Part 2 video) of ``seconds``; ``text`` = ``(words, from s, to s)`` burnt
    in over that range; ``sound``: int16 samples at :data:`RATE` Hz as its AAC audio track
    (padded with silence to the video's length)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        video = container.add_stream("mpeg4", rate=fps)
        video.width, video.height, video.pix_fmt = size[0], size[1], "yuv420p"
        video.codec_context.qmax = 4
        audio = None
        if sound is not None:
            audio = container.add_stream("aac", rate=RATE, layout="mono")
        for i in range(int(seconds * fps)):
            t = i / fps
            shown = text[0] if text and text[1] <= t < text[2] else None
            container.mux(video.encode(av.VideoFrame.from_image(_frame(size, shown))))
        container.mux(video.encode())
        if audio is not None:
            _write_sound(container, audio, sound, seconds)
    return path


def _write_sound(container, stream, sound: np.ndarray, seconds: float) -> None:
    total = int(seconds * RATE)
    samples = np.zeros(total, dtype=np.int16)
    samples[:min(total, len(sound))] = sound[:total]
    step = 1024
    for at in range(0, total, step):
        frame = av.AudioFrame.from_ndarray(samples[None, at:at + step], format="s16",
                                           layout="mono")
        frame.sample_rate, frame.pts = RATE, at
        container.mux(stream.encode(frame))
    container.mux(stream.encode())


def mux_subtitles(video: str | Path, subtitles: str | Path, out: str | Path,
                  codec: str) -> Path:
    """``video`` with ``subtitles`` muxed in as a ``codec`` stream (``srt``, ``mov_text``,
    ``webvtt``, ``ass``), video copied."""
    import imageio_ffmpeg

    subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-loglevel", "error", "-i",
                    str(video), "-i", str(subtitles), "-map", "0", "-map", "1", "-c", "copy",
                    "-c:s", codec, str(out)], check=True, capture_output=True)
    return Path(out)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), dtype=np.int16)

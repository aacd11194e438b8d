"""Decode a fixed number of frames from one video file.

Frames are sampled uniformly over the clip (or a ``[start, end]`` segment in seconds): the
clip is cut into N equal segments and one frame is taken from each, at a random offset in
training and at the segment centre in evaluation (``sampling="segments"``); or, as the
released code does, the frames at 1 fps are taken and N evenly spaced among those, in
training too (``sampling="released"``). Output is uint8 ``[N, 3, S, S]`` with the short side
resized to ``S`` (bicubic) and centre-cropped, rows past a short clip's frames filled with a
padding colour; normalisation happens later, on the device. Every failure to read a file
surfaces as :class:`VideoDecodeError`.

Three decoders sit behind one interface: MJPEG files (the default output of
``data_prep/compress_videos.py``) are demuxed with PyAV and only the sampled JPEGs decoded,
by libjpeg-turbo; everything else goes through decord, or, where decord is not installed
(it has wheels for x86-64 only), through PyAV, which decodes the file from its start up to
the last sampled frame. ``docs/DATA.md`` ("Notes on decoding") says how their frames differ.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import av
import numpy as np
import simplejpeg
import torch
from torchvision.transforms.v2 import functional as TF

from ..errors import VideoDecodeError
from ..progress import progress as show_progress
from .display import Display, display_of, first_rotation, shown_pixels, upright
from .unreadable import plain_reason

if TYPE_CHECKING:
    import decord

__all__ = [
    "DECODERS",
    "SAMPLINGS",
    "DecodedClip",
    "VideoDecodeError",
    "check_video",
    "check_videos",
    "load_clip",
    "load_video",
    "load_video_partial",
    "sample_indices",
    "sample_indices_released",
    "video_info",
]

# Output widths at which decord 0.6 fails to copy frames out ("The size must exactly match"):
# we step past them, and retry on that error in case other builds have other bad widths.
_DECORD_BAD_WIDTHS = frozenset({12, 16, 24, 48, 72})
_SIZE_MISMATCH = "The size must exactly match"

DECODERS = ("auto", "decord", "pyav")


def sample_indices(
    num_total: int,
    num_frames: int,
    train: bool,
    rng: np.random.Generator | None = None,
    start: int = 0,
    end: int | None = None,
) -> np.ndarray:
    """Pick up to ``num_frames`` frame indices in ``[start, end)``.

    The range is cut into ``num_frames`` equal segments; evaluation takes
    ``floor(segment centre)``, training a uniformly random frame inside each segment. A range
    shorter than ``num_frames`` returns every frame in it (the caller pads and masks).

    Args:
        num_total: frames in the video; ``end`` defaults to it and is clipped to it.
        num_frames: N, the number of frames wanted.
        train: random offsets (True) or segment centres (False).
        rng: source of the training offsets; a fresh unseeded generator when None.
        start, end: frame range (end exclusive).

    Returns:
        int64 array ``[min(N, end - start)]``, strictly increasing.
    """
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    end = num_total if end is None else min(end, num_total)
    start = max(0, start)
    length = end - start
    if length <= 0:
        return np.zeros(0, dtype=np.int64)
    if length <= num_frames:
        return np.arange(start, end, dtype=np.int64)
    step = length / num_frames
    seg = np.arange(num_frames)
    if not train:
        return (start + np.floor((seg + 0.5) * step)).astype(np.int64)
    rng = np.random.default_rng() if rng is None else rng
    # Integer segment edges: strictly increasing because step > 1, so each segment is
    # non-empty and the picks stay sorted and distinct.
    edges = start + np.floor(np.arange(num_frames + 1) * step).astype(np.int64)
    return rng.integers(edges[:-1], edges[1:]).astype(np.int64)


def sample_indices_released(num_total: int, num_frames: int, fps: float, start: int = 0,
                            end: int | None = None) -> np.ndarray:
    """The released loader's frames in ``[start, end)``: one frame a second, then up to
    ``num_frames`` evenly spaced among those (the first and last included).

    "One a second" is every ``int(fps)``-th frame from ``start`` (every frame when the rate
    is below 1 or unknown). Deterministic: training and evaluation take the same frames.

    Returns:
        int64 array ``[min(N, seconds)]``, strictly increasing.
    """
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    end = num_total if end is None else min(end, num_total)
    start = max(0, start)
    if end <= start:
        return np.zeros(0, dtype=np.int64)
    grid = np.arange(start, end, max(1, int(fps)), dtype=np.int64)  # 1 fps
    if len(grid) <= num_frames:
        return grid
    return grid[np.linspace(0, len(grid) - 1, num_frames).astype(np.int64)]


def _open_container(path: Path) -> tuple[av.container.InputContainer, av.VideoStream]:
    """The file's container and its first video stream, from the header only."""
    if not path.is_file():
        raise VideoDecodeError(path, "file not found")
    if path.stat().st_size == 0:
        raise VideoDecodeError(path, "empty file (0 bytes)")
    try:
        container = av.open(str(path))
    except Exception as exc:
        raise VideoDecodeError(path, plain_reason(path, exc)) from exc
    if not container.streams.video:
        container.close()
        raise VideoDecodeError(path, "no video stream")
    stream = container.streams.video[0]
    if stream.codec_context.width <= 0 or stream.codec_context.height <= 0:
        container.close()
        raise VideoDecodeError(
            path, f"bad frame size {stream.codec_context.width}x{stream.codec_context.height}"
        )
    return container, stream


def _fps(stream: av.VideoStream) -> float:
    """The stream's average frame rate (0.0: unknown)."""
    rate = stream.average_rate or stream.guessed_rate
    return float(rate) if rate else 0.0


def _decode_size(width: int, height: int, image_size: int) -> tuple[int, int]:
    """Size to ask the decoder for: short side ``image_size`` when downscaling, else native.

    Downscaling inside the decoder is far cheaper than decoding full resolution and resizing
    afterwards; upscaling is left to the bicubic resize so no detail is invented twice.
    """
    short = min(width, height)
    if short > image_size:
        scale = image_size / short
        # ceil keeps the short side >= image_size after rounding.
        width, height = (max(image_size, int(np.ceil(width * scale))),
                         max(image_size, int(np.ceil(height * scale))))
    while width in _DECORD_BAD_WIDTHS:
        width += 1
    return width, height


def _decord_module():
    """decord, or None where it is not installed (imported on first use: MJPEG files and
    the PyAV fallback need none)."""
    try:
        import decord
    except ImportError:
        return None
    return decord


def _open_reader(path: Path, width: int, height: int) -> decord.VideoReader:
    decord = _decord_module()
    if decord is None:
        raise ValueError("decoder='decord' but decord is not installed: pip install decord "
                         "(x86-64 wheels), or use decoder='auto' (PyAV where it is missing)")
    try:
        reader = decord.VideoReader(
            str(path), ctx=decord.cpu(0), width=width, height=height, num_threads=1
        )
    except Exception as exc:
        raise VideoDecodeError(path, plain_reason(path, exc)) from exc
    if len(reader) <= 0:
        raise VideoDecodeError(path, "no frames")
    return reader


def _decord_batch(
    path: Path, reader: decord.VideoReader, size: tuple[int, int], indices: np.ndarray
) -> np.ndarray:
    """uint8 ``[n, H, W, 3]`` frames at ``indices``; reopens past decord's bad widths."""
    width, height = size
    for attempt in range(3):
        try:
            return reader.get_batch(indices.tolist()).asnumpy()
        except Exception as exc:
            if _SIZE_MISMATCH not in str(exc) or attempt == 2:
                raise VideoDecodeError(path, plain_reason(path, exc, "decoding")) from exc
        width += 1
        reader = _open_reader(path, width, height)
    raise AssertionError("unreachable")


def _decord_each(
    path: Path, size: tuple[int, int], indices: np.ndarray
) -> tuple[np.ndarray, int]:
    """The frames at ``indices`` that decode on their own, and how many did not.

    After a failed frame the reader is reopened: a decoder that choked on a damaged packet
    can stay wedged (a batch over a clip with a few damaged packets fails whole).
    """
    reader, kept = _open_reader(path, *size), []
    for i in indices.tolist():
        try:
            kept.append(reader.get_batch([i]).asnumpy()[0])
        except Exception:
            reader = _open_reader(path, *size)
    if not kept:
        raise VideoDecodeError(path, f"none of the {len(indices)} sampled frames decodes")
    return np.stack(kept), len(indices) - len(kept)


# Picks the frame indices to decode from (frames in the file, its frame rate).
_Picker = Callable[[int, float], np.ndarray]


def _jpeg_frames(
    path: Path, container: av.container.InputContainer, stream: av.VideoStream, pick: _Picker,
    partial: bool = False,
) -> tuple[np.ndarray, int] | None:
    """Frames of an MJPEG stream, decoded by libjpeg-turbo straight from the packets.

    Every MJPEG packet is one self-contained JPEG image, so sampling needs no seeking and no
    decoder state: the whole clip is demuxed and only the picked packets decoded. Larger
    frames are decoded whole and resized (libjpeg's k/8 scaling was no faster).

    With ``partial``, a file holding fewer packets than its header promises (an interrupted
    write) is sampled over the packets it holds, as the other decoders sample what a file
    holds; a packet cut in the middle is a lost frame.

    Returns:
        uint8 ``[n, H, W, 3]`` and the number of picked frames lost, or None when libjpeg
        rejects a packet (some camera MJPEG omits its Huffman tables, a frame may differ in
        size from the header, a packet may be damaged); the caller then falls back to decord,
        which handles the first two and, with ``partial``, skips damaged frames one by one.
    """
    try:
        packets = [packet for packet in container.demux(stream) if packet.size]
    except Exception as exc:
        raise VideoDecodeError(path, plain_reason(path, exc, "reading")) from exc
    if not packets:
        raise VideoDecodeError(path, "no frames")
    if stream.frames and len(packets) < stream.frames and not partial:
        # decord would fail on the missing tail too; check_video reports it
        raise VideoDecodeError(path, f"truncated: {len(packets)} of {stream.frames} frames")
    indices = pick(len(packets), _fps(stream))
    height, width = stream.codec_context.height, stream.codec_context.width
    frames = np.empty((len(indices), height, width, 3), dtype=np.uint8)
    ok = np.zeros(len(indices), dtype=bool)
    for row, i in enumerate(indices):
        try:
            # From the packet's own buffer straight into the output row: no copies.
            simplejpeg.decode_jpeg(packets[i], colorspace="RGB", buffer=frames[row])
            ok[row] = True
        except ValueError:
            # Strict, or nothing decoded (a stream libjpeg cannot read at all): decord.
            # Partial with some frames decoded: this packet is damaged, its frame lost.
            if not partial:
                return None
    if not ok.any() and len(indices):
        return None
    display = display_of(stream, _packet_rotation(stream, packets[0]))
    return _shown(frames[ok], display), len(indices) - int(ok.sum())


def _packet_rotation(stream: av.VideoStream, packet: av.Packet) -> int:
    """The display rotation of the frame ``packet`` decodes to (0 where it does not)."""
    try:
        return next((frame.rotation for frame in stream.codec_context.decode(packet)), 0)
    except (av.FFmpegError, ValueError):
        return 0


def _shown(frames: np.ndarray, display: Display) -> np.ndarray:
    """Stored uint8 ``[n, h, w, 3]`` frames as a player shows them: stretched to square
    pixels (bicubic) and turned."""
    width, height = display.unturned_size()
    if not len(frames):
        shown = display.shown_size()
        return np.zeros((0, shown[1], shown[0], 3), dtype=np.uint8)
    if (width, height) != (frames.shape[2], frames.shape[1]):
        stretched = TF.resize(torch.from_numpy(frames).permute(0, 3, 1, 2), [height, width],
                              interpolation=TF.InterpolationMode.BICUBIC, antialias=True)
        frames = stretched.permute(0, 2, 3, 1).numpy()
    return np.ascontiguousarray(upright(frames, display.rotation))


def _frame_count(path: Path, stream: av.VideoStream) -> int:
    """Frames in the stream: the header's count, else its packets counted (no decoding)."""
    if stream.frames > 0:
        return int(stream.frames)
    try:
        with av.open(str(path)) as container:
            return sum(1 for packet in container.demux(container.streams.video[0])
                       if packet.size)
    except Exception as exc:
        raise VideoDecodeError(path, plain_reason(path, exc, "reading")) from exc


class _Placer:
    """A decoded frame's index in presentation order: counted while every packet decodes,
    from its timestamp (``(pts - first pts) * time base * rate``) once one did not."""

    def __init__(self, stream: av.VideoStream):
        rate = stream.average_rate or stream.guessed_rate
        self.per_tick = float(stream.time_base * rate) if stream.time_base and rate else 0.0
        self.origin: float | None = None  # the pts frame 0 has (or would have)
        self.counting = True

    def lost_one(self) -> None:
        self.counting = self.per_tick <= 0  # without timestamps, counting is all there is

    def __call__(self, frame: av.VideoFrame, counted: int) -> int:
        if self.origin is None and frame.pts is not None and self.per_tick > 0:
            self.origin = frame.pts - counted / self.per_tick
        if self.counting or frame.pts is None or self.origin is None:
            return counted
        return round((frame.pts - self.origin) * self.per_tick)


def _pyav_frames(path: Path, container: av.container.InputContainer, stream: av.VideoStream,
                 pick: _Picker, size: tuple[int, int], partial: bool
                 ) -> tuple[np.ndarray, int]:
    """Frames at the picked indices (presentation order, as decord counts them), decoded by
    PyAV from the start of the file, scaled to ``size`` (the unturned display size, square
    pixels) by its scaler and turned upright.

    A packet that fails to decode fails the file, or with ``partial`` is skipped (its frame
    lost; the frames after it are then placed by their timestamps, since counting would shift
    them). A file whose frames end before its header's count (an encoder that never flushed
    its last frames, a cut download whose last packet is whole) is sampled again over the
    frames it holds, which is what decord counts.
    """
    fps = _fps(stream)
    total = _frame_count(path, stream)
    indices = pick(total, fps)
    if len(indices) == 0:
        turned = display_of(stream, first_rotation(container, stream)).turned
        width, height = size[::-1] if turned else size
        return np.zeros((0, height, width, 3), dtype=np.uint8), 0
    found, seen = _pyav_scan(path, container, stream, indices, size, partial)
    if seen <= indices[-1] and 0 < seen < total:
        indices = pick(seen, fps)
        with av.open(str(path)) as again:
            found, seen = _pyav_scan(path, again, again.streams.video[0], indices, size,
                                     partial)
    lost = len(indices) - len(found)
    if lost and not partial:
        raise VideoDecodeError(path, f"truncated: {seen} frames decode, frame {indices[-1]} "
                                     "was asked for")
    if not found:
        raise VideoDecodeError(path, f"none of the {len(indices)} sampled frames decodes")
    return np.stack([found[i] for i in indices.tolist() if i in found]), lost


def _pyav_scan(path: Path, container: av.container.InputContainer, stream: av.VideoStream,
               indices: np.ndarray, size: tuple[int, int], partial: bool
               ) -> tuple[dict[int, np.ndarray], int]:
    """One pass of :func:`_pyav_frames`: ``({index: upright frame}, frames seen)``, the
    pass ending after the last of ``indices`` or at the end of the file."""
    wanted, found, seen = set(indices.tolist()), {}, 0
    width, height = size
    place = _Placer(stream)
    for packet in container.demux(stream):
        try:
            frames = packet.decode()
        except av.FFmpegError as exc:
            if not partial:
                raise VideoDecodeError(path, plain_reason(path, exc, "decoding")) from exc
            place.lost_one()
            continue
        for frame in frames:
            seen = place(frame, seen)
            if seen in wanted:
                found[seen] = shown_pixels(frame, width=width, height=height)
            seen += 1
        if seen > indices[-1]:
            break
    return found, seen


def _decode(path: Path, pick: _Picker, short_side: int, decoder: str,
            partial: bool = False) -> tuple[np.ndarray, int]:
    """uint8 ``[n, h, w, 3]`` frames of ``path`` at the indices ``pick`` chooses, as a player
    shows them (:mod:`dicosa.data.display`), and how many picked frames were lost (with
    ``partial``, the frames of a damaged file that decode are kept, in order).

    ``short_side`` lets decord and PyAV decode at reduced size (never below it); the JPEG
    path always decodes the stored size, which ``compress_videos`` already made small.
    """
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
    container, stream = _open_container(path)
    with container:
        if decoder == "auto" and stream.codec_context.name == "mjpeg":
            decoded = _jpeg_frames(path, container, stream, pick, partial)
            if decoded is not None:
                return decoded
        if decoder == "pyav" or (decoder == "auto" and (_decord_module() is None
                                                        or _timed_by_count(container))):
            size = _decode_size(*display_of(stream).unturned_size(), short_side)
            return _pyav_frames(path, container, stream, pick, size, partial)
        display = display_of(stream, first_rotation(container, stream))
    return _decord_frames(path, display, pick, short_side, partial)


def _timed_by_count(container: av.container.InputContainer) -> bool:
    """Whether the stream's frames are placed by counting them as the decoder outputs them:
    an AVI has no presentation timestamps (its packets carry decode-order counters), so
    decord, seeking by them, returns other frames than the ones asked for, and PyAV's times
    go back and forth under packed B-frames (``docs/DATA.md``, "Notes on decoding")."""
    return container.format.name == "avi"


def _decord_frames(path: Path, display: Display, pick: _Picker, short_side: int,
                   partial: bool) -> tuple[np.ndarray, int]:
    """:func:`_decode` by decord, which turns frames itself: the size asked of it is
    the shown one (square pixels, turned)."""
    shown = display.shown_size()
    size = _decode_size(*shown, short_side)
    # Asking decord for the native size still runs its scaler, so a size is passed only when
    # it differs.
    native = size == shown and display.sar == 1.0
    reader = _open_reader(path, -1, -1) if native else _open_reader(path, *size)
    indices = pick(len(reader), float(reader.get_avg_fps()))
    if len(indices) == 0:  # at the shown size, which video_info reports
        return np.zeros((0, shown[1], shown[0], 3), dtype=np.uint8), 0
    try:
        return _decord_batch(path, reader, size, indices), 0
    except VideoDecodeError:
        if not partial:
            raise
    return _decord_each(path, size, indices)


def _resize_crop(frames: np.ndarray, image_size: int) -> torch.Tensor:
    """uint8 ``[n, h, w, 3]`` -> ``[n, 3, S, S]``: short side to S (bicubic), centre crop."""
    height, width = frames.shape[1:3]
    if min(height, width) != image_size:
        resized = TF.resize(torch.from_numpy(frames).permute(0, 3, 1, 2), [image_size],
                            interpolation=TF.InterpolationMode.BICUBIC, antialias=True)
        return TF.center_crop(resized, [image_size, image_size]).contiguous()
    # Already at size (what compress_videos writes): crop by slicing and transpose once;
    # numpy's transpose copy is about twice as fast as torch's for uint8.
    top, left = (height - image_size) // 2, (width - image_size) // 2
    frames = frames[:, top:top + image_size, left:left + image_size]
    return torch.from_numpy(np.ascontiguousarray(frames.transpose(0, 3, 1, 2)))


SAMPLINGS = ("segments", "released")


def _picker(path: Path, num_frames: int, sampling: str, train: bool = False,
            segment: tuple[float, float] | None = None,
            rng: np.random.Generator | None = None) -> _Picker:
    """The frame indices :func:`load_video` and :func:`load_video_partial` decode, as a
    function of (frames in the file, its frame rate): one definition, so the index and
    evaluation pick the same frames of a video under the same ``sampling``."""
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling must be 'segments' or 'released', got {sampling!r}")

    def pick(total: int, fps: float) -> np.ndarray:
        start, end = 0, total
        if segment is not None:
            if fps <= 0:
                raise VideoDecodeError(path, "unknown frame rate, cannot seek to a segment")
            start = min(max(0, int(np.floor(segment[0] * fps))), total - 1)
            # A segment that rounds to nothing still yields one frame rather than none.
            end = min(total, max(start + 1, int(np.ceil(segment[1] * fps))))
        if sampling == "released":
            return sample_indices_released(total, num_frames, fps, start, end)
        return sample_indices(total, num_frames, train, rng, start, end)

    return pick


def load_video(
    path: str | os.PathLike,
    num_frames: int,
    image_size: int,
    train: bool = False,
    segment: tuple[float, float] | None = None,
    rng: np.random.Generator | None = None,
    decoder: str = "auto",
    sampling: str = "segments",
    pad_colour: tuple[int, int, int] = (0, 0, 0),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode ``num_frames`` frames of ``path`` as model input.

    Args:
        num_frames: N.
        image_size: S, side of the square output frames.
        train: random offset inside each segment (True) or segment centres (False); the
            released sampling ignores it.
        segment: ``(start, end)`` in seconds to sample from; the whole video when None.
        rng: generator of the training offsets.
        decoder: ``"auto"`` decodes MJPEG files (what ``compress_videos`` writes by default)
            with libjpeg-turbo and everything else with decord (PyAV where decord is not
            installed); ``"decord"`` or ``"pyav"`` uses that one for every file.
        sampling: ``"segments"`` (:func:`sample_indices`) or ``"released"``
            (:func:`sample_indices_released`).
        pad_colour: RGB of the rows past the decoded frames.

    Returns:
        frames: uint8 ``[N, 3, S, S]``; rows past the decoded frames are ``pad_colour``.
        mask: bool ``[N]``, True for real frames.

    Raises:
        VideoDecodeError: the file is missing, empty, or cannot be decoded.
    """
    path = Path(path)
    pick = _picker(path, num_frames, sampling, train, segment, rng)
    decoded, _ = _decode(path, pick, image_size, decoder)
    return _pad(_resize_crop(decoded, image_size), num_frames, image_size, pad_colour)


def load_video_partial(
    path: str | os.PathLike, num_frames: int, image_size: int, decoder: str = "auto",
    pad_colour: tuple[int, int, int] = (0, 0, 0), sampling: str = "segments",
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """:func:`load_video` (evaluation sampling) that keeps what a damaged file still gives.

    The N frames are picked over the frames the file holds (``sampling`` as for
    :func:`load_video`; a file cut short is sampled over what is left of it, and
    :func:`load_clip` says how many frames that was); those that do not decode (a damaged
    stretch, a cut packet) are dropped, the rest keep their order at the front and the mask
    marks them. For indexing, where a partly damaged video is better found than skipped.

    Returns:
        frames: uint8 ``[N, 3, S, S]``; mask: bool ``[N]``; lost: the fraction of the picked
        frames that did not decode (0.0 for a sound file).

    Raises:
        VideoDecodeError: no picked frame decodes, or the file cannot be opened at all.
    """
    clip = load_clip(path, num_frames, image_size, decoder, pad_colour, sampling)
    return clip.frames, clip.mask, clip.lost


@dataclass
class DecodedClip:
    """What :func:`load_clip` decoded of a file, and over what it sampled."""

    frames: torch.Tensor  # uint8 [N, 3, S, S]
    mask: torch.Tensor  # bool [N]
    lost: float  # fraction of the picked frames that did not decode
    picked: int  # frames picked
    num_frames: int  # frames sampled over: those the file holds, as the decoder counts them
    fps: float  # the stream's frame rate (0: unknown)

    @property
    def duration(self) -> float:
        """Seconds decoded: the frames sampled over at the frame rate (NaN: no rate)."""
        return self.num_frames / self.fps if self.fps > 0 else float("nan")


def load_clip(path: str | os.PathLike, num_frames: int, image_size: int,
              decoder: str = "auto", pad_colour: tuple[int, int, int] = (0, 0, 0),
              sampling: str = "segments") -> DecodedClip:
    """:func:`load_video_partial`, with the frame count and rate it sampled over (a video's
    duration as decoded, and its frames' times, follow from them)."""
    path = Path(path)
    pick, seen = _picker(path, num_frames, sampling), {"total": 0, "fps": 0.0}

    def recorded(total: int, fps: float) -> np.ndarray:
        seen.update(total=total, fps=fps)  # the last call is the one sampled over
        return pick(total, fps)

    decoded, lost = _decode(path, recorded, image_size, decoder, partial=True)
    picked = len(decoded) + lost
    frames, mask = _pad(_resize_crop(decoded, image_size), num_frames, image_size, pad_colour)
    return DecodedClip(frames, mask, lost / picked if picked else 0.0, picked,
                       int(seen["total"]), float(seen["fps"]))


def _pad(decoded: torch.Tensor, num_frames: int, image_size: int,
         pad_colour: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``[n, 3, S, S]`` decoded frames -> ``[N, 3, S, S]`` padded with ``pad_colour`` and the
    bool ``[N]`` mask of the real ones."""
    mask = torch.zeros(num_frames, dtype=torch.bool)
    mask[: len(decoded)] = True
    if len(decoded) == num_frames:
        return decoded, mask
    colour = torch.tensor(pad_colour, dtype=torch.uint8).view(1, 3, 1, 1)
    frames = colour.expand(num_frames, 3, image_size, image_size).clone()
    frames[: len(decoded)] = decoded
    return frames, mask


def video_info(path: str | os.PathLike) -> dict:
    """Basic facts about a video file.

    Returns:
        ``{"fps": float, "num_frames": int, "duration": float (s), "width": int,
        "height": int}``; ``num_frames`` is what :func:`load_video` sees.

    Raises:
        VideoDecodeError: the file is missing, empty, or cannot be opened.
    """
    path = Path(path)
    seen: dict[str, float] = {}

    def pick(total: int, fps: float) -> np.ndarray:
        seen.update(num_frames=total, fps=fps)
        return np.zeros(0, dtype=np.int64)

    frames, _ = _decode(path, pick, 1 << 30, "auto")
    fps = seen["fps"]
    return {
        "fps": fps,
        "num_frames": int(seen["num_frames"]),
        "duration": seen["num_frames"] / fps if fps > 0 else float("nan"),
        "width": frames.shape[2],
        "height": frames.shape[1],
    }


def check_video(path: str | os.PathLike, num_probe: int = 4) -> str | None:
    """Why ``path`` cannot be used, or None when it decodes.

    Decodes the first and last frames plus ``num_probe`` evaluation-style samples, through
    the same decoder :func:`load_video` uses (at a tiny size where decord allows it): the last
    frame catches the common case of a container that promises more frames than it holds (an
    interrupted download or re-encode).
    """

    def pick(total: int, fps: float) -> np.ndarray:
        return np.unique(np.r_[0, sample_indices(total, num_probe, train=False), total - 1])

    try:
        _decode(Path(path), pick, 8, "auto")
    except VideoDecodeError as exc:
        return exc.reason
    return None


def check_videos(
    paths: Sequence[str | os.PathLike], num_workers: int = 0, progress: bool = True
) -> list[tuple[str, str]]:
    """Every unusable file among ``paths``, checked in parallel with :func:`check_video`.

    Args:
        num_workers: worker processes; 0 or 1 checks in this process (use that inside
            DataLoader workers, which cannot start processes of their own).
        progress: show progress (:func:`dicosa.progress.progress`).

    Returns:
        ``[(path, reason), ...]`` for the bad files, in the order of ``paths``.
    """
    names = [str(p) for p in paths]
    pool = ProcessPoolExecutor(max_workers=num_workers) if num_workers > 1 else None
    checked = (pool.map(check_video, names, chunksize=max(1, len(names) // (num_workers * 8)))
               if pool else map(check_video, names))
    reasons = list(show_progress(checked, total=len(names), desc="checking videos",
                                 unit="video", enabled=progress))
    if pool:
        pool.shutdown()
    return [(name, reason) for name, reason in zip(names, reasons, strict=True)
            if reason is not None]

"""Frame sampling, decoding, error handling, file checks and re-encoding."""

from __future__ import annotations

import pickle
import shutil
import sys

import av
import numpy as np
import pytest
import torch

from dicosa.data import video as video_module
from dicosa.data.compress import compress_video, compress_videos, plan_outputs
from dicosa.data.video import (
    VideoDecodeError,
    check_video,
    check_videos,
    load_clip,
    load_video,
    load_video_partial,
    sample_indices,
    sample_indices_released,
    video_info,
)
from tests._videos import damage, level_to_index, truncate, write_frames, write_video


def decoded_indices(frames: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """Which source frames ``load_video`` returned, read from their grey levels."""
    return level_to_index(frames[mask].float().mean(dim=(1, 2, 3)).numpy())


@pytest.fixture(params=["decord", "pyav"])
def decoding(request, monkeypatch) -> str:
    """Each test with decord, and with decord not installed (``import decord`` fails, as on
    a machine without its wheels): the PyAV fallback."""
    if request.param == "pyav":
        monkeypatch.setitem(sys.modules, "decord", None)
    return request.param


# ---------------------------------------------------------------- sample_indices


def test_eval_indices_are_segment_centres():
    # 8 frames in 4 segments of 2: centres at 1, 3, 5, 7.
    assert sample_indices(8, 4, train=False).tolist() == [1, 3, 5, 7]
    # 10 frames in 4 segments of 2.5: centres 1.25, 3.75, 6.25, 8.75.
    assert sample_indices(10, 4, train=False).tolist() == [1, 3, 6, 8]
    assert sample_indices(100, 4, train=False, start=20, end=60).tolist() == [25, 35, 45, 55]


def test_eval_indices_are_deterministic_and_ignore_rng():
    a = sample_indices(97, 12, train=False, rng=np.random.default_rng(1))
    b = sample_indices(97, 12, train=False, rng=np.random.default_rng(2))
    assert a.tolist() == b.tolist()


@pytest.mark.parametrize("total,n,start,end", [(13, 12, 0, None), (100, 12, 0, None),
                                                (1000, 64, 0, None), (300, 7, 40, 91)])
def test_train_indices_fall_one_per_segment(total, n, start, end):
    rng = np.random.default_rng(0)
    stop = total if end is None else end
    edges = start + np.floor(np.arange(n + 1) * (stop - start) / n)
    seen = set()
    for _ in range(50):
        idx = sample_indices(total, n, train=True, rng=rng, start=start, end=end)
        assert len(idx) == n
        assert np.all((idx >= edges[:-1]) & (idx < edges[1:]))
        seen.add(tuple(idx.tolist()))
    # Random offsets: 50 draws are not all the same (segments here span >= 1 frame choice).
    if stop - start > n:
        assert len(seen) > 1


def test_train_indices_reproducible_with_seeded_rng():
    a = sample_indices(500, 12, True, np.random.default_rng(7))
    b = sample_indices(500, 12, True, np.random.default_rng(7))
    assert a.tolist() == b.tolist()


def test_short_range_returns_every_frame():
    assert sample_indices(5, 12, train=True).tolist() == [0, 1, 2, 3, 4]
    assert sample_indices(5, 12, train=False).tolist() == [0, 1, 2, 3, 4]
    assert sample_indices(100, 12, False, start=10, end=13).tolist() == [10, 11, 12]


def test_range_is_clipped_and_may_be_empty():
    assert sample_indices(20, 4, False, start=18, end=50).tolist() == [18, 19]
    assert sample_indices(20, 4, False, start=25).size == 0
    assert sample_indices(0, 4, False).size == 0
    with pytest.raises(ValueError):
        sample_indices(10, 0, False)


# ---------------------------------------------------------------- load_video


@pytest.mark.parametrize("codec,fps", [("mpeg4", 10), ("libx264", 25), ("mjpeg", 3)])
def test_eval_decodes_the_centre_frames(tmp_path, codec, fps, decoding):
    path = write_video(tmp_path / "v.mp4", 40, fps=fps, codec=codec)
    frames, mask = load_video(path, 12, 32)
    assert frames.shape == (12, 3, 32, 32) and frames.dtype == torch.uint8
    assert mask.dtype == torch.bool and mask.all()
    assert decoded_indices(frames, mask).tolist() == sample_indices(40, 12, False).tolist()
    again, _ = load_video(path, 12, 32)
    assert torch.equal(frames, again)


def test_train_decodes_one_frame_per_segment(tmp_path):
    path = write_video(tmp_path / "v.mp4", 50)
    frames, mask = load_video(path, 5, 32, train=True, rng=np.random.default_rng(3))
    got = decoded_indices(frames, mask)
    assert got.tolist() == sample_indices(50, 5, True, np.random.default_rng(3)).tolist()
    assert np.all(got // 10 == np.arange(5))  # segments of 10 frames


def test_short_video_is_padded_and_masked(tmp_path, decoding):
    path = write_video(tmp_path / "short.mp4", 5)
    frames, mask = load_video(path, 12, 32, train=True)
    assert mask.tolist() == [True] * 5 + [False] * 7
    assert decoded_indices(frames, mask).tolist() == [0, 1, 2, 3, 4]
    assert frames[5:].eq(0).all()


@pytest.mark.parametrize("codec", ["mpeg4", "mjpeg"])
def test_segment_in_seconds(tmp_path, codec, decoding):
    path = write_video(tmp_path / "v.mp4", 50, fps=10, codec=codec)
    frames, mask = load_video(path, 4, 32, segment=(2.0, 4.0))
    assert decoded_indices(frames, mask).tolist() == [22, 27, 32, 37]
    frames, mask = load_video(path, 4, 32, segment=(4.5, 7.0))  # clipped at the end
    assert decoded_indices(frames, mask).tolist() == [45, 46, 48, 49]
    # A segment past the end still yields the last frame rather than nothing.
    frames, mask = load_video(path, 4, 32, segment=(6.0, 8.0))
    assert mask.tolist() == [True, False, False, False]
    assert decoded_indices(frames, mask).tolist() == [49]


@pytest.mark.parametrize("width,height,size", [(80, 48, 32), (48, 32, 64), (40, 96, 24),
                                               (320, 240, 224)])
def test_output_is_square_crop_of_requested_size(tmp_path, width, height, size, decoding):
    path = write_video(tmp_path / "v.mp4", 2, width=width, height=height)
    frames, mask = load_video(path, 2, size)
    assert frames.shape == (2, 3, size, size)
    assert decoded_indices(frames, mask).tolist() == [0, 1]


def test_centre_crop_keeps_the_middle(tmp_path):
    # A wide clip: red outer bands, green middle square. After resizing the short side to
    # 32 and cropping 32x32 from the centre only green remains.
    img = np.zeros((2, 32, 96, 3), np.uint8)
    img[:, :, :, 0] = 220
    img[:, :, 32:64] = (20, 220, 20)
    path = write_frames(tmp_path / "wide.mp4", img)
    frames, _ = load_video(path, 2, 32)
    centre = frames[:, :, :, 4:-4].float().mean(dim=(0, 2, 3))
    assert centre[1] > 180 and centre[0] < 60


@pytest.mark.parametrize("kind", ["missing", "empty", "truncated", "truncated-mjpeg",
                                  "garbage"])
def test_bad_files_raise_video_decode_error(tmp_path, kind, decoding):
    path = tmp_path / f"{kind}.mp4"
    if kind == "empty":
        path.touch()
    elif kind == "truncated":
        truncate(write_video(path, 30), 0.5)
    elif kind == "truncated-mjpeg":
        truncate(write_video(path, 30, codec="mjpeg"), 0.5)
    elif kind == "garbage":
        path.write_bytes(b"not a video" * 200)
    with pytest.raises(VideoDecodeError) as info:
        load_video(path, 4, 32)
    assert info.value.path == str(path)
    assert str(path) in str(info.value)
    # Picklable, so it crosses process boundaries intact.
    again = pickle.loads(pickle.dumps(info.value))
    assert (again.path, str(again)) == (info.value.path, str(info.value))
    with pytest.raises(VideoDecodeError):
        video_info(path)
    assert check_video(path) is not None


def _textured_clip(num_frames: int, height: int, width: int) -> np.ndarray:
    """Smooth colour gradients plus noise, panning: detail for a decoder to get wrong."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:height, 0:width + 4 * num_frames]
    base = np.stack([128 + 90 * np.sin(x / 7 + c) * np.cos(y / 5 - c) for c in range(3)], -1)
    base += rng.normal(0, 12, base.shape)
    frames = [base[:, 4 * t : 4 * t + width] for t in range(num_frames)]
    return np.clip(frames, 0, 255).astype(np.uint8)


def test_jpeg_path_is_as_faithful_as_decord_and_never_opens_decord(tmp_path, monkeypatch):
    source = _textured_clip(20, 48, 80)
    path = write_frames(tmp_path / "v.mp4", source, codec="mjpeg")
    # At the stored short side no resizing happens, so only the decoders differ.
    reference, ref_mask = load_video(path, 6, 48, decoder="decord")

    def no_decord(*args, **kwargs):
        raise AssertionError("decord opened for an MJPEG file")

    monkeypatch.setattr(video_module, "_open_reader", no_decord)
    frames, mask = load_video(path, 6, 48)
    assert torch.equal(mask, ref_mask) and frames.shape == reference.shape
    # libjpeg-turbo and ffmpeg upsample chroma and convert colour differently, so
    # pixels differ by a few levels; what matters is that the JPEG path is no further from
    # the frames that were encoded than decord is.
    original = torch.from_numpy(source[sample_indices(20, 6, False)]).permute(0, 3, 1, 2)
    original = original[..., 16:64].float()  # the centre 48x48 crop
    ours = (frames.float() - original).abs().mean()
    theirs = (reference.float() - original).abs().mean()
    assert ours <= theirs * 1.05, (ours, theirs)
    assert (frames.float() - reference.float()).mean(dim=(0, 2, 3)).abs().max() < 1.5
    assert video_info(path)["num_frames"] == 20
    assert check_video(path) is None


def test_jpeg_path_keeps_colours(tmp_path):
    colours = np.array([(200, 60, 90), (20, 220, 40), (240, 240, 20), (30, 30, 200)], np.uint8)
    path = write_frames(tmp_path / "v.mp4", np.broadcast_to(colours[:, None, None],
                                                            (4, 32, 32, 3)), codec="mjpeg")
    frames, _ = load_video(path, 4, 32)
    got = frames[:, :, 8:24, 8:24].float().mean(dim=(2, 3))
    assert (got - torch.from_numpy(colours).float()).abs().max() <= 3


def test_jpeg_packets_libjpeg_rejects_fall_back_to_decord(tmp_path, monkeypatch):
    path = write_video(tmp_path / "v.mp4", 30, codec="mjpeg")

    def reject(*args, **kwargs):
        raise ValueError("Huffman table 0x00 was not defined")

    monkeypatch.setattr(video_module.simplejpeg, "decode_jpeg", reject)
    frames, mask = load_video(path, 4, 32)
    assert decoded_indices(frames, mask).tolist() == sample_indices(30, 4, False).tolist()


def test_unknown_decoder_is_rejected(tmp_path, monkeypatch):
    path = write_video(tmp_path / "v.mp4", 3)
    with pytest.raises(ValueError, match="decoder"):
        load_video(path, 2, 32, decoder="ffmpeg")
    monkeypatch.setitem(sys.modules, "decord", None)
    with pytest.raises(ValueError, match="decord is not installed"):
        load_video(path, 2, 32, decoder="decord")


# PyAV's scaler and decord's differ: on a textured clip downscaled 240 -> 224 px the frames
# were measured 2.2 grey levels apart on average (at most 11), with no colour shift.
PYAV_MEAN_DIFFERENCE = 3.0
PYAV_COLOUR_SHIFT = 0.5


@pytest.mark.parametrize("codec", ["mpeg4", "libx264"])
@pytest.mark.parametrize("size", [32, 224])
def test_pyav_fallback_gives_decords_frames_within_tolerance(tmp_path, codec, size,
                                                             monkeypatch):
    path = write_frames(tmp_path / "v.mp4", _textured_clip(20, 240, 320), codec=codec)
    reference, ref_mask = load_video(path, 8, size, decoder="decord")
    info = video_info(path)
    monkeypatch.setitem(sys.modules, "decord", None)  # not installed: the fallback decodes
    frames, mask = load_video(path, 8, size)
    assert torch.equal(mask, ref_mask) and frames.shape == reference.shape
    ours, theirs = frames.float(), reference.float()
    assert (ours - theirs).abs().mean() <= PYAV_MEAN_DIFFERENCE
    assert (ours - theirs).mean(dim=(0, 2, 3)).abs().max() <= PYAV_COLOUR_SHIFT
    # the same frames: each is nearest to decord's frame at its own position
    distance = (ours[:, None] - theirs[None]).abs().mean(dim=(2, 3, 4))  # [ours, theirs]
    assert distance.argmin(dim=1).tolist() == list(range(8))
    assert video_info(path) == info


def test_video_info(tmp_path, decoding):
    path = write_video(tmp_path / "v.mp4", 25, fps=10, width=64, height=48)
    info = video_info(path)
    assert info == {"fps": 10.0, "num_frames": 25, "duration": 2.5, "width": 64, "height": 48}


@pytest.mark.parametrize("workers", [0, 2])
def test_check_videos_lists_every_bad_file_in_order(tmp_path, workers):
    good = [write_video(tmp_path / f"g{i}.mp4", 6) for i in range(3)]
    empty = tmp_path / "empty.mp4"
    empty.touch()
    broken = truncate(write_video(tmp_path / "broken.mp4", 20), 0.3)
    paths = [good[0], empty, good[1], tmp_path / "missing.mp4", broken, good[2]]
    bad = check_videos(paths, num_workers=workers, progress=False)
    assert [p for p, _ in bad] == [str(empty), str(tmp_path / "missing.mp4"), str(broken)]
    assert "not found" in bad[1][1] and "empty" in bad[0][1]


# ---------------------------------------------------------------- compress_videos


def test_compress_videos_resamples_resumes_and_reports(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    write_video(src / "a.mp4", 40, fps=10, width=96, height=64)
    write_video(src / "movie" / "b.avi", 20, fps=10, width=32, height=48)
    (src / "bad.mp4").write_bytes(b"junk" * 100)
    report = compress_videos(src, dst, fps=5, short_side=32, num_workers=2, progress=False,
                             codec="h264", square=False)
    assert report["done"] == 2 and report["skipped"] == 0
    assert [p for p, _ in report["failed"]] == [str(src / "bad.mp4")]
    a, b = video_info(dst / "a.mp4"), video_info(dst / "movie" / "b.mp4")
    assert (a["width"], a["height"], a["fps"]) == (48, 32, 5.0)
    assert abs(a["duration"] - 4.0) < 0.3
    assert (b["width"], b["height"]) == (32, 48)  # short side already <= 32: kept
    assert not list(dst.rglob(".*"))  # no partial files left behind
    # A rerun redoes nothing that finished (the bad file is tried, and fails, again).
    again = compress_videos(src, dst, fps=5, short_side=32, num_workers=2, progress=False)
    assert again["done"] == 0 and again["skipped"] == 2 and len(again["failed"]) == 1


def test_default_compression_is_the_centre_square_in_mjpeg(tmp_path):
    # Wide clip with a green centre square between red bands: the default output keeps the
    # square only, and loading it gives what loading the original gives.
    img = np.zeros((20, 64, 192, 3), np.uint8)
    img[..., 0] = 220
    img[:, :, 64:128] = (20, 220, 20)
    src = write_frames(tmp_path / "src" / "wide.mp4", img, fps=10)
    out = tmp_path / "out.mp4"
    assert compress_video(src, out, fps=5, short_side=32) is None
    with av.open(str(out)) as container:
        assert container.streams.video[0].codec_context.name == "mjpeg"
    info = video_info(out)
    assert (info["width"], info["height"], info["num_frames"]) == (32, 32, 10)
    frames, _ = load_video(out, 4, 32)
    assert frames[:, 1].float().mean() > 180 and frames[:, 0].float().mean() < 60
    reference, _ = load_video(src, 4, 32)
    assert (frames.float() - reference.float()).abs().mean() < 8
    with pytest.raises(ValueError, match="codec"):
        compress_video(src, out, codec="vp9")


def test_compress_refuses_to_write_into_its_source(tmp_path):
    write_video(tmp_path / "a.mp4", 3)
    for dst in (tmp_path, tmp_path / "out"):
        with pytest.raises(ValueError, match="outside"):
            plan_outputs(tmp_path, dst)
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
    assert plan_outputs(tmp_path, tmp_path.parent / "elsewhere") != []


# ---------------------------------------------------------------- the released protocol


def test_released_indices_are_one_a_second_then_evenly_spaced():
    assert sample_indices_released(50, 3, fps=10).tolist() == [0, 20, 40]  # of 0, 10, .., 40
    assert sample_indices_released(50, 12, fps=10).tolist() == [0, 10, 20, 30, 40]
    assert sample_indices_released(100, 4, fps=10, start=25, end=95).tolist() == [25, 45, 65, 85]
    assert sample_indices_released(7, 4, fps=0.5).tolist() == [0, 2, 4, 6]  # every frame
    assert sample_indices_released(10, 4, fps=10, start=12).tolist() == []


def test_released_sampling_in_training_and_mean_colour_padding(tmp_path):
    path = write_video(tmp_path / "v.mp4", 50, fps=10)
    mean = (123, 117, 104)  # CLIP's mean colour in uint8
    for train in (True, False):  # the released grid is used in training too
        frames, mask = load_video(path, 8, 32, train=train, rng=np.random.default_rng(1),
                                  sampling="released", pad_colour=mean)
        assert decoded_indices(frames, mask).tolist() == [0, 10, 20, 30, 40]
        assert mask.tolist() == [True] * 5 + [False] * 3
        padded = frames[5:].permute(1, 0, 2, 3).flatten(1)  # [3, pixels]
        assert padded.eq(torch.tensor(mean, dtype=torch.uint8)[:, None]).all()
    with pytest.raises(ValueError, match="sampling"):
        load_video(path, 8, 32, sampling="uniform")


@pytest.mark.parametrize("codec", ["mpeg4", "mjpeg"])
def test_partial_decoding_keeps_the_frames_around_a_damaged_stretch(tmp_path, codec,
                                                                    decoding):
    path = damage(write_video(tmp_path / f"{codec}.mp4", 30, codec=codec), 10, 15)
    with pytest.raises(VideoDecodeError):  # the strict loader refuses the file
        load_video(path, 10, 32)
    frames, mask, lost = load_video_partial(path, 10, 32)
    picked = sample_indices(30, 10, train=False)  # 1, 4, ..., 28: 10 and 13 are damaged
    kept = decoded_indices(frames, mask)
    assert mask[: len(kept)].all() and not mask[len(kept):].any()  # kept frames in front
    assert set(kept) <= set(picked) - {10, 13} and list(kept) == sorted(kept)
    assert len(kept) >= 6  # a decoder may lose a neighbour of the stretch, not the video
    assert lost == pytest.approx(1 - len(kept) / 10)
    assert (frames[~mask] == 0).all()


@pytest.mark.parametrize("sampling, pad_colour, picked", [
    ("segments", (0, 0, 0), sample_indices(30, 8, False).tolist()),
    ("released", (123, 117, 104), [0, 10, 20]),  # 1 fps of 3 s, then padded with the mean
])
def test_partial_decoding_of_a_sound_file_is_the_strict_decoding(tmp_path, sampling,
                                                                  pad_colour, picked,
                                                                  decoding):
    path = write_video(tmp_path / "sound.mp4", 30)
    frames, mask, lost = load_video_partial(path, 8, 32, pad_colour=pad_colour,
                                            sampling=sampling)
    strict_frames, strict_mask = load_video(path, 8, 32, sampling=sampling,
                                            pad_colour=pad_colour)
    assert lost == 0.0 and torch.equal(mask, strict_mask) and torch.equal(frames, strict_frames)
    assert decoded_indices(frames, mask).tolist() == picked
    assert (frames[~mask] == torch.tensor(pad_colour, dtype=torch.uint8).view(3, 1, 1)).all()


def test_partial_decoding_of_a_cut_mjpeg_file_keeps_its_head(tmp_path):
    # AVI keeps its frame count in the header, so a cut file says how much is missing (a cut
    # MP4 loses its index at the end and does not open at all).
    path = truncate(write_video(tmp_path / "cut.avi", 30, codec="mjpeg"), 0.5)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        promised, packets = stream.frames, sum(1 for p in container.demux(stream) if p.size)
    assert (promised, packets) == (30, 11)  # the 11th packet is cut mid-image
    with pytest.raises(VideoDecodeError, match="truncated"):
        load_video(path, 10, 32)
    # sampled over the 11 packets it holds, as decord and PyAV sample what a file holds
    clip = load_clip(path, 10, 32)
    assert (clip.num_frames, clip.picked) == (11, 10)
    assert list(decoded_indices(clip.frames, clip.mask)) == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert clip.lost == pytest.approx(0.1)  # pick 10: the packet cut mid-image


def test_partial_decoding_of_garbage_still_raises(tmp_path):
    path = tmp_path / "garbage.mp4"
    path.write_bytes(b"not a video" * 200)
    with pytest.raises(VideoDecodeError):
        load_video_partial(path, 4, 32)

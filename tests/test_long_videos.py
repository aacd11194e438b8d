"""Long videos in an index: frames at a rate, segments as rows, videos ranked by their best
segment and answered with moments; old indexes; bad files."""

import json
import logging

import numpy as np
import pytest
import torch

from dicosa.index import VideoIndex
from dicosa.model import DiCoSA
from dicosa.search.moment import timeline_rows, video_timelines
from dicosa.search.shards import RunShard

from ._index import searcher
from ._videos import damage, write_scenes, write_video
from .conftest import tiny_config

COLOURS = [(200, 30, 30), (30, 200, 30), (20, 20, 90), (230, 230, 230), (120, 60, 0)]
QUERIES = ["a red circle moves left", "a blue square", "a white cross grows"]


@pytest.fixture(scope="module")
def model() -> DiCoSA:
    torch.manual_seed(0)
    return DiCoSA.from_config(tiny_config()).eval()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("long")
    write_scenes(root / "five_scenes.mp4", COLOURS, seconds=3.0)  # 15 s, cuts every 3 s
    write_scenes(root / "one_long_shot.mp4", COLOURS[:1], seconds=11.0)  # no cut, 11 s
    write_scenes(root / "clip.mp4", COLOURS[2:3], seconds=2.0)  # shorter than a window
    return root


@pytest.fixture(scope="module")
def index(model, folder):
    return VideoIndex.build(model, folder, None, num_workers=0, progress=False,
                            backend="exact")


def _rows(index, name):
    table = index.store.table.all()
    return table[table["path"].str.endswith(name)]


def test_long_videos_become_runs_cut_into_shots_and_windows(index, folder):
    assert len(index) == 3 and index.segments.window == 4 and index.segments.rate == 1.0
    assert all(isinstance(s, RunShard) for s in index.store.shards)
    scenes = _rows(index, "five_scenes.mp4")
    # one segment per 3-s scene (no window needed): exactly the scenes' ranges
    assert scenes[["start", "end"]].to_numpy().tolist() == [[3.0 * i, 3.0 * i + 3]
                                                           for i in range(5)]
    assert scenes["video"].nunique() == 1 and scenes["valid_frames"].iloc[0] == 15
    shot = _rows(index, "one_long_shot.mp4")  # 11 frames: windows of 4 every 2, last at 7
    assert shot[["start", "end"]].to_numpy().tolist() == [[0, 4], [2, 6], [4, 8], [6, 10],
                                                          [7, 11]]
    clip = _rows(index, "clip.mp4")  # 2 s <= 4 s: one row of N protocol frames, as before
    assert len(clip) == 1 and clip[["start", "end"]].to_numpy().tolist() == [[0, 2]]
    # each stored frame's time is the second it was decoded at
    ids = scenes.index.to_numpy()
    times = index.store.videos.times(ids)
    np.testing.assert_allclose(times[:, :3], [[3 * i, 3 * i + 1, 3 * i + 2] for i in range(5)])
    assert np.isnan(times[:, 3]).all()  # the fourth slot of a 3-frame segment is padding
    # no frame is stored twice: the long shot's 11 frames once, whatever its windows
    shard = index.store.shards[0]
    assert len(shard.frames) == 15 + 11 + 4


def test_search_ranks_videos_by_their_best_segment_with_moments(index, model):
    for query in QUERIES:
        hits = index.search(query, k=3, candidates=None)  # every row scored exhaustively
        assert sorted(h.path for h in hits) == sorted(set(index.paths))
        with torch.no_grad():
            text = model.encode_text(index.tokenizer([query]))
        for hit in hits:
            rows = index.store.videos.rows(hit.id)
            reference = searcher(index).exhaustive(text, rows, 64)[0]  # DiCoSA.score per row
            assert hit.score == pytest.approx(float(reference.max()), abs=1e-5)
            assert hit.row == rows[int(reference.argmax())]
            spans = index.store.videos.spans(np.array([m.row for m in hit.moments]))
            for m, (start, end) in zip(hit.moments, spans, strict=True):  # a range round its row
                assert m.start <= start + 1e-4 and end <= m.end + 1e-4
            scores = [m.score for m in hit.moments]
            assert scores == sorted(scores, reverse=True) and len(hit.moments) <= 3
            for a in hit.moments:  # no two moments overlap
                assert all(b is a or b.end <= a.start or a.end <= b.start for b in hit.moments)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    # two-stage search reranking every row gives the same answer
    two_stage = index.search(QUERIES[0], k=3, candidates=1000)
    exhaustive = index.search(QUERIES[0], k=3, candidates=None)
    assert [(h.id, h.row) for h in two_stage] == [(h.id, h.row) for h in exhaustive]


def test_top_moments_and_the_timeline_over_the_whole_video(index, model):
    result = index.query(QUERIES[1], k=3, candidates=None)
    found = result.top_moments(6)
    assert len(found) == 6
    scores = [m.score for _, _, m in found]
    assert scores == sorted(scores, reverse=True)
    for path, video, moment in found:
        assert index.store.videos.of(np.array([moment.row]))[0] == video
        assert index.store.table.paths(np.array([video]))[0] == path
    long_hit = next(i for i, h in enumerate(result.hits) if h.path.endswith("five_scenes.mp4"))
    timeline = result.timelines([long_hit])[0]
    assert len(timeline.times) == 15 and timeline.times == [float(t) for t in range(15)]
    # each frame carries the score of its (only) segment, the scene it is in
    rows = index.store.videos.rows(result.hits[long_hit].id)
    with torch.no_grad():
        text = model.encode_text(index.tokenizer([QUERIES[1]]))
    per_row = searcher(index).exhaustive(text, rows, 64)[0].numpy()
    np.testing.assert_allclose(timeline.scores, np.repeat(per_row, 3), atol=1e-5)
    assert timeline.moments[0].row == rows[int(per_row.argmax())]
    best = int(per_row.argmax())
    assert 3 * best <= timeline.best_frame < 3 * best + 3


@pytest.mark.paths
def test_a_timeline_reuses_the_scores_of_the_rows_its_search_scored(index, monkeypatch):
    """``SearchResult.timelines`` scores only the rows its search did not: after an
    exhaustive search nothing is scored again; after a search of 3 candidates the hits'
    other rows are, and every frame gets the score it gets from the exhaustive search
    (another code path: close, not equal)."""
    import dicosa.search.rerank as rerank

    scored = []
    real = rerank.pair_scores
    monkeypatch.setattr(rerank, "pair_scores", lambda model, text, video, **options: (
        scored.append(len(video.frame_mask)) or real(model, text, video, **options)))
    every = index.query(QUERIES[1], k=3, candidates=None)
    full = every.timelines(range(len(every.hits)))
    assert scored == [] and all(t is not None for t in full)
    few = index.query(QUERIES[1], k=3, candidates=3)
    assert few.candidates == 3
    scored.clear()
    sampled = few.timelines(range(len(few.hits)))
    unscored = sum(len(np.setdiff1d(index.store.videos.rows(h.id), few.ids)) for h in few.hits)
    assert unscored > 0 and sum(scored) == unscored
    by_video = {h.id: t for h, t in zip(every.hits, full, strict=True)}
    for hit, timeline in zip(few.hits, sampled, strict=True):
        np.testing.assert_allclose(timeline.frame_score, by_video[hit.id].frame_score,
                                   atol=1e-5)


def test_a_timeline_of_more_rows_than_allowed_scores_the_kept_and_spread_rows(index, model):
    """``max_rows``: a video of more rows has that many scored (those kept, the rest spread
    evenly), each with the score the whole timeline gives it; the other rows' frames are left
    out (no time, no score); a video within the limit is scored whole."""
    scenes = index.store.videos.rows(_rows(index, "five_scenes.mp4")["video"].iloc[0])
    assert timeline_rows(scenes, None, 10).tolist() == scenes.tolist()
    assert timeline_rows(scenes, None, 3).tolist() == scenes[[0, 2, 4]].tolist()
    assert timeline_rows(scenes, scenes[[3]], 3).tolist() == scenes[[0, 3, 4]].tolist()
    assert timeline_rows(scenes, scenes[[0, 4]], 3).tolist() == scenes[[0, 1, 4]].tolist()
    # more rows to keep than allowed: the first of them (best first), once each
    assert timeline_rows(scenes, scenes[[4, 4, 1, 2]], 2).tolist() == scenes[[1, 4]].tolist()
    # with the rows' start times, spread in time: four short scenes and a long one at 30 s
    starts = np.array([0.0, 1.0, 2.0, 3.0, 30.0])
    assert timeline_rows(scenes, None, 3, starts).tolist() == scenes[[0, 3, 4]].tolist()
    starts[2] = np.nan  # a time unknown: by position
    assert timeline_rows(scenes, None, 3, starts).tolist() == scenes[[0, 2, 4]].tolist()
    with torch.no_grad():
        text = model.encode_text(index.tokenizer([QUERIES[1]])).text
    video = int(scenes[0])
    together, every_kept = video_timelines(model, index.store, index.frames, text,
                                           [video, video], max_rows=2,
                                           keep=[scenes[[3]], scenes])
    sampled = video_timelines(model, index.store, index.frames, text, [video],
                              max_rows=2, keep=[scenes[[3]]])[0]
    assert (sampled.video_rows, sampled.scored_rows) == (5, 2)
    assert (every_kept.video_rows, every_kept.scored_rows) == (5, 2)  # at most 2, kept or not
    assert together.times == sampled.times  # each video's rows its own in one call
    np.testing.assert_allclose(together.frame_score, sampled.frame_score, atol=1e-6)
    scored = [3 * i + j for i in (0, 3) for j in range(3)]  # the spread row 0 and kept row 3
    assert [j for j, t in enumerate(sampled.times) if t is not None] == scored
    full = video_timelines(model, index.store, index.frames, text, [video])[0]
    assert (full.video_rows, full.scored_rows) == (5, 5)
    assert [sampled.scores[j] for j in scored] == [full.scores[j] for j in scored]
    assert all(sampled.scores[j] is None for j in range(15) if j not in scored)
    assert {m.row for m in sampled.moments} <= {int(scenes[0]), int(scenes[3])}
    # sent: only frames a scored row holds, thinned among them (3 stretches of 2 here)
    thinned = sampled.as_dict(max_points=3)
    assert thinned["rows"] == 5 and thinned["scored_rows"] == 2
    assert [f["frame"] for f in thinned["frames"]] == [
        max(pair, key=lambda j: (sampled.scores[j], sampled.weights[j]))
        for pair in ((0, 1), (2, 9), (10, 11))]
    assert sampled.best_frame in [f["frame"] for f in thinned["frames"]]
    assert len(full.as_dict(max_points=3)["frames"]) == 3


def test_pooling_a_segment_is_pooling_the_clip_it_is(index, model):
    """A segment of k < N frames scores as DiCoSA scores those frames as a clip: the run's
    frames through the temporal transformer per shot, padded like a short clip."""
    rows = _rows(index, "five_scenes.mp4").index.to_numpy()
    stored = index.store.gather(rows[:1])  # [1, N, D]: 3 frames and one padding slot
    assert stored.frame_mask.tolist() == [[True, True, True, False]]
    from dicosa.data.stream import FrameStream

    pixels = next(iter(FrameStream(index.store.table.paths(rows[:1])[0], 1.0, 32))).frames[:3]
    frames = torch.zeros(4, *pixels.shape[1:], dtype=torch.uint8)  # black padding, as clips
    frames[:3] = pixels
    mask = torch.tensor([[True, True, True, False]])
    with torch.no_grad():
        encoded = model.encode_video(frames[None], mask)  # the scene's 1-fps frames, a clip
        text = model.encode_text(index.tokenizer(QUERIES[:1]))
        segment = model.score(text, stored.to(dtype=torch.float32))
        clip = model.score(text, encoded)
    torch.testing.assert_close(stored.frames[0, :3].float(), encoded.frames[0, :3],
                               atol=2e-3, rtol=0)
    if model.mask_mode == "before":  # the padding slot never counts
        torch.testing.assert_close(segment, clip, atol=5e-3, rtol=0)


def test_remove_and_re_add_a_long_video(model, folder, tmp_path):
    index = VideoIndex.build(model, folder, tmp_path / "index", num_workers=0,
                             progress=False, backend="exact")
    long_id = next(i for i, p in zip(index.ids, index.paths, strict=True)
                   if p.endswith("five_scenes.mp4"))
    rows = index.store.videos.rows(long_id)
    assert len(rows) == 5
    assert index.remove(np.array([rows[2]])) == 5  # any row names its whole video
    assert len(index) == 2 and not len(index.store.videos.rows(long_id))
    hits = index.search(QUERIES[0], k=3, candidates=None)
    assert all(not h.path.endswith("five_scenes.mp4") for h in hits)
    assert index.add(folder, num_workers=0, progress=False) == 1
    reopened = VideoIndex.load(tmp_path / "index", model)
    assert len(reopened) == 3 and len(reopened.store) == 5 + 5 + 1
    assert json.loads((tmp_path / "index" / "manifest.json").read_text())["version"] == 4


def test_an_index_without_segments_keeps_its_layout(model, folder, tmp_path):
    out = tmp_path / "old"
    VideoIndex.build(model, [folder / "clip.mp4"], out, num_workers=0, progress=False,
                     backend="exact", segments=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["version"] == 2 and "segments" not in manifest  # as before moments
    old = VideoIndex.load(out, model)
    assert old.segments is None
    assert old.add(folder, num_workers=0, progress=False) == 2  # N frames per video
    assert len(old.store) == len(old) == 3
    hits = old.search(QUERIES[0], k=3)
    assert all(len(h.moments) == 1 and h.moments[0].start == 0.0 for h in hits)
    with pytest.raises(ValueError, match=r"keeps one row per video .* build a new index"):
        VideoIndex.build(model, folder, out, segments=True, num_workers=0, progress=False)


def test_damaged_and_unreadable_long_videos(model, tmp_path, caplog):
    folder = tmp_path / "videos"
    write_video(folder / "damaged.avi", 50, fps=5)  # 10 s
    damage(folder / "damaged.avi", 20, 26)
    (folder / "empty.mp4").write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        index = VideoIndex.build(model, folder, None, num_workers=0, progress=False,
                                 backend="exact", segments={"detector": "none"})
    assert [p.rsplit("/", 1)[1] for p, _ in index.skipped] == ["empty.mp4"]
    row = index.metadata.iloc[0]
    assert 0.05 < row["frames_lost"] < 0.3
    assert any("did not decode" in r.message and "indexed the rest" in r.message
               for r in caplog.records)
    spans = index.store.videos.spans(index.store.videos.rows(int(index.ids[0])))
    # no segment spans the lost stretch (about 4-5.2 s): it is a boundary
    assert not ((spans[:, 0] < 4.0) & (spans[:, 1] > 5.5)).any()
    assert spans[:, 0].min() == 0 and spans[:, 1].max() == pytest.approx(10.0)


def test_subtitles_of_a_long_video_find_the_segment_they_fall_in(model, folder, tmp_path):
    """A cue at 7-8 s of the five-scene video belongs to its third scene's segment (6-9 s):
    a search of its words finds the video at that moment, and says the line."""
    import shutil

    from dicosa.plugins.text import attach_text

    videos = tmp_path / "videos"
    videos.mkdir()
    shutil.copy(folder / "five_scenes.mp4", videos / "talk.mp4")
    shutil.copy(folder / "clip.mp4", videos / "other.mp4")
    (videos / "talk.srt").write_text("1\n00:00:07,000 --> 00:00:08,000\nthe lighthouse keeper\n")
    index = VideoIndex.build(model, videos, tmp_path / "index", num_workers=0,
                             progress=False, backend="exact")
    text = attach_text(index)
    result = index.query("lighthouse keeper", k=2, source="subtitles")
    hit = result.hits[0]
    assert hit.path.endswith("talk.mp4") and (hit.start, hit.end) == (6.0, 9.0)
    line = text.match(result, 0)
    assert line["text"] == "the lighthouse keeper" and (line["start"], line["end"]) == (7, 8)
    assert line["row"] == hit.row


def test_evaluate_moments_on_a_didemo_sample(tmp_path, capsys):
    """``dicosa evaluate --moments didemo`` reads DiDeMo's times and ranks every segment of
    the sample's 22-30 s videos (a random-weight model: the figures are not the point, their
    table and its JSON are)."""
    from dicosa.cli.evaluate_cmd import main

    from ._didemo_sample import write_didemo_sample

    root = write_didemo_sample(tmp_path / "didemo")
    out = tmp_path / "moments.json"
    main(["--moments", "didemo", "--root", str(root), "--config", "synthetic",
          "--out", str(out), "train.output_dir=" + str(tmp_path / "run")])
    printed = capsys.readouterr().out
    assert "didemo/test: 3 videos" in printed and "Video-corpus moment retrieval" in printed
    result = json.loads(out.read_text())
    assert result["num_queries"] > 0 and result["num_multi_annotator"] == result["num_queries"]
    assert result["rows"] > result["videos"] == 3  # 22-30 s videos are several segments each
    assert result["min_list_length"] >= 10 and result["selected_on"] is None


def test_audio_only_files_and_a_failing_detector(model, folder, tmp_path, caplog,
                                                 monkeypatch):
    import av

    from dicosa.data import shots

    videos = tmp_path / "videos"
    videos.mkdir()
    with av.open(str(videos / "voice.m4a"), "w") as container:  # audio only: no video stream
        stream = container.add_stream("aac", rate=16000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 16000), np.float32), format="fltp",
                                           layout="mono")
        frame.sample_rate = 16000
        for packet in stream.encode(frame):
            container.mux(packet)
        container.mux(stream.encode())
    (videos / "voice.m4a").rename(videos / "voice.mp4")
    import shutil

    shutil.copy(folder / "five_scenes.mp4", videos / "scenes.mp4")

    def broken(self, kind, threshold):
        raise RuntimeError("no detector today")

    monkeypatch.setattr(shots.ShotDetector, "_make", broken)
    with caplog.at_level(logging.WARNING):
        index = VideoIndex.build(model, videos, None, num_workers=0, progress=False,
                                 backend="exact")
    assert [(p.rsplit("/", 1)[1], r) for p, r in index.skipped] == [("voice.mp4",
                                                                      "no video stream")]
    assert any("no detector today" in r.message and "cut into windows alone" in r.message
               for r in caplog.records)
    # 15 frames in windows of 4 every 2: the video is still searchable, as windows
    spans = index.store.videos.spans(index.store.videos.rows(int(index.ids[0])))
    assert spans[:, 0].tolist() == [0, 2, 4, 6, 8, 10, 11]

"""The end-to-end demo behind ``dicosa demo``: every stage of the library, on CPU.

1. write the synthetic benchmark (MSR-VTT layout) under ``OUT/data``;
2. train the tiny model with ``configs/synthetic.yaml`` into ``OUT/run``;
3. evaluate the best checkpoint on the test split (raw metrics table);
4. draw the factor visualisation of the test split's first caption and its video (a pair
   chosen by position, :data:`PAIR_RULE`, never by how the model does on it);
5. index the test videos and a few long videos of unseen scenes, search them with that
   caption in two stages (first-stage candidates, then the DiCoSA rerank), printing each
   stage's time, the top 5 and where the caption's own video ranked beside the model's
   test R@1 and R@5, then search a scene of a long video and print its moment;
6. train the lexical (VDR) head on the frozen model and print that query's words with their
   contributions to the sparse score;
7. train a concepts head, answer one "A without B" query and show which results show B.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .config import replace, resolve_config

__all__ = ["PAIR_RULE", "run_demo"]

# How the demo picks the caption and video it shows (figure and search): by position, so that
# what it shows is a typical pair, not one chosen for looking good.
PAIR_RULE = ("the test split's first caption (its first clause: the tiny model reads 16 "
             "tokens) and its own video, taken by position, not by how the model does on it")

# The carried first-stage summary fitted on the training videos alone, 600 steps: ~15 s
# instead of the ~4 min train.py spends on its cut videos (dicosa/heads/summary.py), so the
# demo stays about a minute; its index shows the path, not the best recall.
_DEMO_SUMMARY = ("cuts_per_video=0", "steps=600")
# (train videos, test videos, training overrides) per mode. The full run is the benchmark
# configs/synthetic.yaml describes; the quick one only checks that every stage runs.
_FULL = (300, 100, {"summary_options": _DEMO_SUMMARY})
_QUICK = (24, 8, {"epochs": 1, "max_steps": 2, "batch_size": 8, "log_every": 1,
                  "summary_options": ("cuts_per_video=0", "steps=40")})


def run_demo(out_dir: str | Path = "outputs/demo", *, quick: bool = False,
             config: str | Path = "configs/synthetic.yaml",
             overrides: Sequence[str] = ()) -> dict[str, Path]:
    """Run the demo, print where each output is, and return those paths.

    Args:
        out_dir: folder for the data, the run, the figure, the index and the results.
        quick: a tiny dataset and two training steps (a smoke test, not a result).
        config: the training config (``section.key=value`` ``overrides`` applied on top).

    Returns:
        ``{"data", "run", "checkpoint", "metrics", "figure", "index", "search"}`` paths.
    """
    from .checkpoint import load
    from .evaluation import evaluate, format_table
    from .training import train

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    _stage("1/7 synthetic benchmark")
    cfg, data = _benchmark(out, resolve_config(config, None, overrides), quick)

    _stage("2/7 training")
    run = Path(train(cfg))
    checkpoint = run / "best.pt" if (run / "best.pt").is_file() else run / "last.pt"

    _stage("3/7 evaluation")
    results = evaluate(cfg, checkpoint, out=out / "metrics.json")
    print(format_table(results))

    _stage("4/7 factor visualisation")
    model, cfg = load(checkpoint)
    pair = _Pair.first(cfg, data)
    figure_path = _factors(model, cfg, pair, out / "factors.png")

    _stage("5/7 index and search")
    index, search_path = _index_and_search(model, cfg, checkpoint, data, pair, results, out,
                                           quick)

    _stage("6/7 words: the lexical (VDR) head")
    row = [Path(p) for p in index.paths].index(Path(pair.video).resolve())
    head_path = _lexical_words(model, checkpoint, out / "lexical.pt", pair.caption,
                               index.store.gather(index.ids[row:row + 1]))

    _stage("7/7 an exclusion query (\"A without B\")")
    from .demo_exclusion import run_exclusion_demo

    exclusion_path = run_exclusion_demo(index, checkpoint, data, out, quick=quick)

    outputs = {"data": data, "run": run, "checkpoint": checkpoint,
               "metrics": Path(results.get("json_path", out / "metrics.json")),
               "figure": figure_path, "index": out / "index", "search": search_path,
               "lexical": head_path}
    if exclusion_path is not None:
        outputs["exclusion"] = exclusion_path
    _stage(f"done in {time.perf_counter() - started:.0f} s; outputs")
    for name, path in outputs.items():
        print(f"  {name:<11}{path}")
    print(f"look at the results in a browser: dicosa serve {out / 'index'}  (then "
          "open http://127.0.0.1:8000/)")
    return outputs


def _benchmark(out: Path, cfg, quick: bool):
    """Step 1: the synthetic benchmark written under ``out/data``; the config pointed at it
    and at ``out/run`` with the mode's training overrides."""
    from .data.synthetic import make_synthetic

    num_train, num_test, train_overrides = _QUICK if quick else _FULL
    if cfg.model.pretrained is None:
        print(f"model: {cfg.model.arch} from random weights (model.pretrained is null: "
              "nothing is downloaded; the numbers below check the pipeline, not DiCoSA)")
    # Clips at the model's resolution: decoding larger frames only to shrink them is wasted.
    data = make_synthetic(out / "data", num_train=num_train, num_test=num_test,
                          size=_image_size(cfg.model.arch), seconds=1.0, seed=0)
    cfg = replace(cfg, data={"root": str(data)},
                  train={"output_dir": str(out / "run"), **train_overrides})
    return cfg, data


@dataclass(frozen=True)
class _Pair:
    """The caption and video the demo shows (:data:`PAIR_RULE`), and the training captions
    that name the figure's factors."""

    caption: str
    video: str
    vocabulary: list[str]

    @classmethod
    def first(cls, cfg, data: Path) -> _Pair:
        from .data.datasets import load_split

        test = load_split(cfg.data.dataset, data, cfg.data.test_split)
        vocabulary = load_split(cfg.data.dataset, data, cfg.data.train_split).captions
        # Its first clause: the tiny model reads 16 tokens, and longer captions would be cut
        # with a warning in every stage below.
        return cls(test.captions[0].split(",")[0], test.video_paths[test.caption_video[0]],
                   vocabulary)


def _factors(model, cfg, pair: _Pair, figure_path: Path) -> Path:
    """Step 4: the factor figure of the pair, and its score factor by factor."""
    from .data.protocol import FrameProtocol
    from .visualize import visualize_factors

    print(f"the pair shown here and searched in step 5: {PAIR_RULE}")
    _, report = visualize_factors(model, pair.video, pair.caption, vocabulary=pair.vocabulary,
                                  save_path=figure_path, protocol=FrameProtocol.of(cfg.data))
    scored = report.pairs[0]
    print(f'"{pair.caption}" vs {Path(pair.video).name}: S = {scored.similarity:.3f} = sum '
          "over factors of g·s:")
    for k in range(len(scored.cosines)):
        print(f"  {k}: {scored.contributions[k]:+.3f} ({', '.join(scored.factor_names[k])})")
    return figure_path


def _index_and_search(model, cfg, checkpoint: Path, data: Path, pair: _Pair, results: dict,
                      out: Path, quick: bool):
    """Step 5: the test videos and a few long videos of unseen scenes indexed, the pair's
    caption searched in two stages (where its video ranked, beside the model's test
    recall), then a scene of a long video and its moment; ``(index, search.json)``."""
    from .data.datasets import load_split
    from .data.long_synthetic import load_long_synthetic, make_long_synthetic
    from .heads.summary import default_summary
    from .index import VideoIndex

    summary, notice = default_summary(checkpoint, model)  # what `index` does: the carried one
    print(notice)
    test = load_split(cfg.data.dataset, data, cfg.data.test_split)
    # Long videos of scenes the model never trained on, joined by hard cuts: the index finds
    # their shots and searches inside them.
    long_root = make_long_synthetic(out / "data" / "long", num_videos=2 if quick else 3,
                                    scenes_per_video=3 if quick else 6,
                                    exclude_root=data,
                                    size=_image_size(cfg.model.arch), num_workers=1)
    long = load_long_synthetic(long_root)
    index = VideoIndex.build(model, [*test.video_paths, *map(str, long.video_paths)],
                             out / "index", **summary,
                             num_workers=cfg.data.num_workers,
                             frame_sampling=cfg.data.frame_sampling,
                             frame_padding=cfg.data.frame_padding, meta={
                                 "model": {"checkpoint": str(checkpoint.resolve())}})
    # A fifth of the collection as candidates, so that both stages visibly do work here
    # (the default, 1000, would rerank every one of these 100 videos).
    candidates = max(2, len(index) // 5)
    result = index.query(pair.caption, k=5, candidates=candidates)
    ranks = _ranks(index, pair.caption, pair.video, candidates)
    recall = {key: results["metrics"]["raw"]["t2v"][key] for key in ("R@1", "R@5")}
    search_path = out / "search.json"
    search_path.write_text(json.dumps({
        "query": pair.caption, "rule": PAIR_RULE, "expected": str(Path(pair.video).resolve()),
        "expected_rank": ranks, "model_test_t2v": recall, "candidates": candidates,
        "stats": {**result.times, "stage": result.stage, "mode": result.mode,
                  "candidates": [result.candidates], "truncated": [result.truncated]},
        "results": [h.as_dict() for h in result.hits]}, indent=1))
    _print_search(result, pair, len(index))
    print(_rank_sentence(Path(pair.video).name, ranks, len(index), result.candidates, recall))
    _moment(index, long)
    return index, search_path


def _print_search(result, pair: _Pair, videos: int) -> None:
    """Each stage's time and the top 5, the pair's own video marked."""
    times = result.times
    print(f"two-stage search: encode text {1000 * times['encode_s']:.1f} ms, first stage "
          f"({result.stage}) {1000 * times['first_stage_s']:.1f} ms kept "
          f"{result.candidates} of {videos} videos, DiCoSA rerank "
          f"{1000 * times['rerank_s']:.1f} ms")
    print(f'top 5 for "{pair.caption}" (the caption of {Path(pair.video).name}):')
    for rank, hit in enumerate(result.hits, 1):
        mark = "  <- its video" if Path(hit.path) == Path(pair.video).resolve() else ""
        print(f"  {rank}. {hit.score:.4f}  {Path(hit.path).name}  ({hit.stage}){mark}")


def _ranks(index, caption: str, video: str, candidates: int) -> dict[str, int | None]:
    """Where ``video`` ranks for ``caption``: among every video scored by DiCoSA
    (``exhaustive``), and in the two-stage search with ``candidates`` (None: the first stage
    did not propose it)."""
    target = Path(video).resolve()
    out = {}
    for name, asked in (("exhaustive", None), ("two_stage", candidates)):
        ranking = [Path(h.path) for h in index.search(caption, k=len(index), candidates=asked)]
        out[name] = ranking.index(target) + 1 if target in ranking else None
    return out


def _rank_sentence(name: str, ranks: dict, videos: int, kept: int, recall: dict) -> str:
    """Where the caption's own video ranked, beside the model's test recall: what tells a
    weak model from a broken search."""
    staged = (f"{ranks['two_stage']} in this two-stage search" if ranks["two_stage"]
              else f"not among the {kept} candidates this two-stage search reranked")
    weak = ("" if ranks["exhaustive"] == 1 else
            ": a model this small often ranks other videos above a caption's own")
    return (f"{name} ranks {ranks['exhaustive']} of {videos} videos when DiCoSA scores every "
            f"one, {staged}; this model's test R@1 is {recall['R@1']:.1f}% and R@5 "
            f"{recall['R@5']:.1f}% (step 3, whole captions){weak}")


def _moment(index, long) -> None:
    """Search one scene of a long video and print the best moments with where it is."""
    from .search.moment import format_span

    caption, (start, end) = long.captions[0], long.ranges[0][0]
    where = Path(long.video_paths[long.caption_video[0]]).name
    found = index.query(caption, k=3).top_moments(3)
    print(f'moments for "{caption}" (the scene is {where} '
          f"{format_span(start, end)}; {len(index.store)} rows for {len(index)} videos):")
    for rank, (path, _, moment) in enumerate(found, 1):
        print(f"  {rank}. {moment.score:.4f}  {Path(path).name}  "
              f"{format_span(moment.start, moment.end)}")


def _lexical_words(model, checkpoint: Path, out: Path, caption: str, video) -> Path:
    """Train the VDR head on the frozen ``model`` and print ``caption``'s words against
    ``video`` (VideoFeatures of one video): the video's top words and each shared word's
    contribution to the sparse score."""
    import torch

    from .clip import get_tokenizer
    from .heads import load_head
    from .heads.train import train_head

    path = train_head("lexical", checkpoint, out, progress=False)
    head = load_head(path, model, kind="lexical")  # on the CPU, where the store's rows are
    tokens = get_tokenizer(model.config.arch, model.config.max_words)([caption])
    with torch.no_grad():
        text = model.encode_text(tokens.to(next(model.parameters()).device)).text.cpu()
        query = head.encode_texts(text, [caption])[0]
    stored = head.encode_videos(video)[0]
    print(f"video's top words: {', '.join(f'{w} {v:.2f}' for w, v in head.top_words(stored, 8))}")
    explained = head.explain(query, stored)
    print(f'"{caption}": sparse score {float(query @ stored):.3f} =')
    for word, value in explained.items():
        print(f"  {word:<12} {value:+.3f}")
    return path


def _image_size(arch: str) -> int:
    """The side of the frames ``arch``'s image tower takes (rounded up to even for yuv420p)."""
    import open_clip

    from .clip import register_architectures

    register_architectures()
    size = open_clip.get_model_config(arch)["vision_cfg"]["image_size"]
    size = size[0] if isinstance(size, (list, tuple)) else size
    return int(size) + int(size) % 2


def _stage(title: str) -> None:
    print(f"\n== {title}", flush=True)

"""Issue 14's bars: retrieval on incomplete galleries, DiCoSA alone vs late fusion vs Mul2vec.

On the synthetic benchmark every gallery clip gets a title (one of its other captions with
20% of the words dropped); queries are the test captions. Conditions: clean; 20% of the
clips corrupted, either half their frames replaced by noise that goes unnoticed ("noise") or
not decodable at all ("undecodable": indexed from the title alone), or half and half
("mixed", the issue's "frames replaced by noise, or undecodable"); 20% of the titles
missing. Methods:

  dicosa   DiCoSA's S alone; an undecodable clip is not indexed (today's behaviour)
  late     S + β·cos(e_query, e_title): the text tower's query-title similarity
  mul2vec  S + β·cos(θ_query, g_video): the Mul2vec head's topic vectors
  both     S + β·cos(θ_query, g_video) + β'·cos(e_query, e_title) (not a bar; for the default)

Each β (and the imputation trust of dicosa.search.title_fusion.fill_missing) is chosen per seed
on the validation videos (carved from the training split as in
DiCoSA's training), maximising R@1+R@5+R@10 averaged over the conditions (one β for
every condition: a deployment does not know how damaged its collection is); test figures
are reported with that β. The head is trained once per seed.

    python benchmarks/mul2vec.py --checkpoint RUN/best.pt    # RUN: a synthetic-benchmark run
    python benchmarks/mul2vec.py --smoke
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from common import environment, report, synthetic_checkpoint

from dicosa import functional as DF
from dicosa.checkpoint import load
from dicosa.clip import get_tokenizer
from dicosa.data.datasets import load_split
from dicosa.data.incomplete import apply_gallery, incomplete_gallery
from dicosa.data.protocol import FrameProtocol
from dicosa.evaluation import encode_texts
from dicosa.heads.features import SplitFeatures, head_data, split_features
from dicosa.heads.mul2vec import Mul2vecHead
from dicosa.heads.train import parse_head_overrides
from dicosa.metrics import ranks_t2v, retrieval_metrics
from dicosa.model import TextFeatures, VideoFeatures
from dicosa.search.title_fusion import fused_scores

CONDITIONS = {
    "clean": {},
    "noise": {"corrupt": 0.2, "corruption": "noise"},
    "undecodable": {"corrupt": 0.2, "corruption": "undecodable"},
    "mixed": {"corrupt": 0.2, "corruption": "mixed"},
    "missing_titles": {"missing_titles": 0.2},
}
BETAS = [0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0]
TRUSTS = [0.0, 0.25, 0.5, 0.75, 1.0]
METHODS = ("dicosa", "late", "mul2vec", "both")


@dataclass
class Gallery:
    """One split ready to search: clips, every caption of each, and the features."""

    features: SplitFeatures
    captions: list[list[str]]  # [V] all captions of each clip (synthetic_meta.json)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--checkpoint", default=None,
                   help="a DiCoSA trained on the synthetic benchmark (default: train one)")
    p.add_argument("--work", default=None, help="folder for data and the trained model")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   help="head setting key=value (repeatable)")
    p.add_argument("--smoke", action="store_true", help="tiny data, a few steps")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def galleries(checkpoint: Path, model, cfg) -> tuple[Gallery, Gallery, object]:
    cache = checkpoint.parent / "cache"
    data = head_data(model, cfg, cache_dir=cache)
    test_split = load_split(cfg.data.dataset, cfg.data.root, cfg.data.test_split)
    test = split_features(model, test_split, frames=FrameProtocol.of(cfg.data), cache_dir=cache)
    meta = json.loads((Path(cfg.data.root) / "synthetic_meta.json").read_text())

    def gallery(features: SplitFeatures) -> Gallery:
        return Gallery(features, [meta[Path(p).stem]["captions"] for p in features.video_paths])

    return gallery(data.val), gallery(test), data


@torch.no_grad()
def noise_clips(model, count: int = 8) -> VideoFeatures:
    """The frozen encoder's output for clips of uniform noise frames (seeded)."""
    g = torch.Generator().manual_seed(1234)
    size, frames = model.image_size, model.config.num_frames
    pixels = torch.randint(0, 256, (count, frames, 3, size, size), generator=g, dtype=torch.uint8)
    return model.encode_video(pixels)


@torch.no_grad()
def condition_parts(model, head, gallery: Gallery, settings: dict, noise: VideoFeatures,
                    seed: int, *, all_queries: bool) -> dict:
    """The score parts ``[Q, V]`` of one gallery under one condition."""
    plan = incomplete_gallery(gallery.captions, [0] * len(gallery.captions), seed=seed,
                              **settings)
    queries, query_video = [], []
    for v, caps in enumerate(gallery.captions):
        for i, caption in enumerate(caps if all_queries else caps[:1]):
            if i != plan.title_source[v]:
                queries.append(caption)
                query_video.append(v)
    tokenize = get_tokenizer(model.config.arch, model.config.max_words)
    e_query = encode_texts(model, queries, tokenize, 256, torch.device("cpu")).text
    has_title = torch.as_tensor(plan.has_title)
    e_title = encode_texts(model, [t or "none" for t in plan.titles], tokenize, 256,
                           torch.device("cpu")).text
    video = apply_gallery(gallery.features.video, plan, noise, seed=seed)
    text_only = torch.as_tensor(plan.text_only)
    scored_mask = video.frame_mask.clone()
    scored_mask[text_only, 0] = True  # placeholder frame; these columns are discarded
    dicosa = model.score(TextFeatures(e_query), VideoFeatures(video.frames, scored_mask))
    dicosa[:, text_only] = float("nan")
    proxy = DF.video_proxy(video.frames, video.frame_mask)
    g = head.entity_vectors(e_title, has_title, proxy, ~text_only,
                            torch.as_tensor(plan.flagged_lost))
    affected = torch.as_tensor(plan.text_only | (plan.frames_lost > 0) | ~plan.has_title)
    return {
        "dicosa": dicosa, "has_video": ~text_only, "has_title": has_title,
        "semantic": head.query_vectors(e_query) @ g.T,
        "title": F.normalize(e_query, dim=-1) @ F.normalize(e_title, dim=-1).T,
        "query_video": torch.tensor(query_video), "affected": affected,
    }


def method_scores(parts: dict, method: str, beta: float, trust: float,
                  beta_title: float = 0.0) -> torch.Tensor:
    if method == "dicosa":  # not indexed when it does not decode
        return parts["dicosa"].masked_fill(~parts["has_video"], float("-inf"))
    if method == "late":
        return fused_scores(parts["dicosa"], parts["has_video"], title=parts["title"],
                            has_title=parts["has_title"], beta_title=beta, trust=trust)["fused"]
    if method == "both":
        return fused_scores(parts["dicosa"], parts["has_video"], parts["semantic"],
                            parts["title"], parts["has_title"], beta_semantic=beta,
                            beta_title=beta_title, trust=trust)["fused"]
    return fused_scores(parts["dicosa"], parts["has_video"], semantic=parts["semantic"],
                        beta_semantic=beta, trust=trust)["fused"]


def metrics(parts: dict, method: str, choice: tuple[float, ...]) -> dict:
    ranks = ranks_t2v(method_scores(parts, method, *choice), parts["query_video"])
    result = {k: round(v, 2) for k, v in retrieval_metrics(ranks).items()
              if k in ("R@1", "R@5", "R@10")}
    hit = parts["affected"][parts["query_video"]]
    if hit.any():
        result["R@5_affected"] = round(float((ranks[hit] <= 5).float().mean() * 100), 2)
        result["affected_queries"] = int(hit.sum())
    return result


def choose(val: dict[str, dict], method: str) -> tuple[float, ...]:
    """(β, trust[, β_title]) maximising validation R@1+R@5+R@10 averaged over the
    conditions."""
    def score(choice: tuple[float, ...]) -> float:
        return statistics.mean(sum(metrics(p, method, choice)[k] for k in ("R@1", "R@5", "R@10"))
                               for p in val.values())
    if method == "dicosa":
        return (0.0, 0.0)
    if method == "both":
        return max(((b, t, bt) for b in BETAS[1:] for t in TRUSTS for bt in BETAS[1:]),
                   key=score)
    return max(((b, t) for b in BETAS for t in TRUSTS), key=score)


def run_seed(model, data, val: Gallery, test: Gallery, noise, config, seed: int) -> dict:
    head = Mul2vecHead.fit(model, data, config, seed=seed, progress=False)
    val_parts = {c: condition_parts(model, head, val, s, noise, seed, all_queries=True)
                 for c, s in CONDITIONS.items()}
    test_parts = {c: condition_parts(model, head, test, s, noise, seed, all_queries=False)
                  for c, s in CONDITIONS.items()}
    chosen = {m: choose(val_parts, m) for m in METHODS}
    return {"seed": seed, "beta_trust": chosen, "fit": head.fit_report,
            "test": {c: {m: metrics(p, m, chosen[m]) for m in METHODS}
                     for c, p in test_parts.items()}}


def summarise(runs: list[dict]) -> dict:
    def stat(values: list[float], digits: int = 2) -> dict:
        return {"mean": round(statistics.mean(values), digits),
                "std": round(statistics.stdev(values), digits) if len(values) > 1 else 0.0}

    table = {c: {m: {k: stat([r["test"][c][m][k] for r in runs])
                     for k in runs[0]["test"][c][m] if k != "affected_queries"}
                 for m in METHODS} for c in CONDITIONS}
    maes = [r["fit"]["heldout_mae"] for r in runs]
    mae = stat(maes, 4)
    r5 = {c: {m: table[c][m]["R@5"]["mean"] for m in METHODS} for c in CONDITIONS}
    bars = {
        "noise: mul2vec R@5 >= dicosa + 5": r5["noise"]["mul2vec"] >= r5["noise"]["dicosa"] + 5,
        "undecodable: mul2vec R@5 >= dicosa + 5":
            r5["undecodable"]["mul2vec"] >= r5["undecodable"]["dicosa"] + 5,
        "mixed: mul2vec R@5 >= dicosa + 5": r5["mixed"]["mul2vec"] >= r5["mixed"]["dicosa"] + 5,
        "clean: mul2vec R@5 >= dicosa - 1": r5["clean"]["mul2vec"] >= r5["clean"]["dicosa"] - 1,
        "held-out MAE <= 0.15": statistics.mean(maes) <= 0.15,
        "mul2vec beats late fusion (R@5, every condition)":
            all(r5[c]["mul2vec"] > r5[c]["late"] for c in CONDITIONS),
        "both beats mul2vec (R@5, every condition)":
            all(r5[c]["both"] > r5[c]["mul2vec"] for c in CONDITIONS),
    }
    return {"test": table, "heldout_mae": mae, "bars": bars}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    overrides = parse_head_overrides(args.overrides)
    if args.smoke:
        overrides = {"steps": 5, "batch_size": 32, **overrides}
    with tempfile.TemporaryDirectory() as tmp:
        if args.checkpoint:
            checkpoint = Path(args.checkpoint)
        else:
            work = Path(args.work or tmp)
            sizes = {"num_train": 12, "num_test": 4} if args.smoke else {}
            checkpoint = synthetic_checkpoint(work, smoke=args.smoke, **sizes)[0]
        model, cfg = load(checkpoint, "cpu")
        model.requires_grad_(False)
        val, test, data = galleries(checkpoint, model, cfg)
        noise = noise_clips(model)
        config = Mul2vecHead.make_config(overrides)
        runs = [run_seed(model, data, val, test, noise, config, s)
                for s in (args.seeds[:1] if args.smoke else args.seeds)]
    result = {"benchmark": "mul2vec", "checkpoint": str(checkpoint), "env": environment("cpu"),
              "split_for_beta": "validation (held out of the training videos)",
              "split_reported": "test", "config": dataclasses.asdict(config),
              **summarise(runs), "runs": runs}
    return report(result, args.out)


if __name__ == "__main__":
    main()

"""The demo's exclusion stage: one "A without B" query on the demo's index, checked against
what the synthetic generator put in each clip (``synthetic_meta.json``)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from .plugins.exclusion import ExclusionPlugin, explain_hits

__all__ = ["clip_objects", "exclusion_pair", "run_exclusion_demo"]

# The concepts head's training on the quick path: a smoke test, like the quick DiCoSA.
QUICK_HEAD = ("spine_steps=60", "steps=60")


def clip_objects(data: Path) -> dict[str, set[str]]:
    """``{clip name: {"red circle", ...}}`` from the generator's ``synthetic_meta.json``, and
    for each long video under ``data/long`` (``long_meta.json``) the objects of all its
    scenes."""
    meta = json.loads((Path(data) / "synthetic_meta.json").read_text())
    out = {name: {f"{o['colour']} {o['shape']}" for o in clip["objects"]}
           for name, clip in meta.items()}
    long = Path(data) / "long" / "long_meta.json"
    if long.is_file():
        for name, video in json.loads(long.read_text())["videos"].items():
            out[name] = {f"{o['colour']} {o['shape']}" for scene in video["scenes"]
                         for o in scene["objects"]}
            for scene in video["scenes"]:  # "long0@3": the scene starting at 3 s
                out[f"{name}@{scene['start']:g}"] = {f"{o['colour']} {o['shape']}"
                                                     for o in scene["objects"]}
    return out


def _shown(objects: dict[str, set[str]], hit) -> tuple[str, set[str]]:
    """What a hit shows: a clip's objects, or those of the scene of a long video's best
    moment (the row that ranked)."""
    name = Path(hit.path).stem
    scene = f"{name}@{hit.start:g}" if hit.start is not None else ""
    if scene in objects:
        return f"{name} {hit.start:g}-{hit.end:g} s", objects[scene]
    return name, objects[name]


def exclusion_pair(objects: dict[str, set[str]], clips: list[str]) -> tuple[str, str] | None:
    """The (A, B) of ``clips`` that appear together in some clip, with A without B in the
    most clips (the most right answers to find); ties: together in more clips, then
    alphabetical. None if there is no such pair. Chosen from the labels only, never from
    search results."""
    together = Counter((a, b) for c in clips for a in objects[c] for b in objects[c] if a != b)
    alone = {(a, b): sum(a in objects[c] and b not in objects[c] for c in clips)
             for a, b in together}
    candidates = sorted((-n, -together[pair], pair) for pair, n in alone.items() if n)
    return candidates[0][2] if candidates else None


def run_exclusion_demo(index, checkpoint: Path, data: Path, out: Path, *,
                       quick: bool, k: int = 5) -> Path | None:
    """Train the concepts head, attach it to ``index``, answer "a A without a B" and print
    whether each result shows B; write ``out/exclusion.json``. None if no pair exists."""
    from .heads.train import train_head

    objects = clip_objects(data)
    stems = {Path(p).stem for p in index.paths}
    # What can show A without B: each clip, and each scene of a long video.
    names = sorted(n for n in objects if n.split("@")[0] in stems and f"{n}@0" not in objects)
    pair = exclusion_pair(objects, names)
    if pair is None:
        print("no test clip shows two objects: nothing to exclude")
        return None
    a, b = pair
    head_path = train_head("concepts", checkpoint, out / "concepts.pt",
                           QUICK_HEAD if quick else (), progress=False)
    plugin = index.use(ExclusionPlugin(head_path))
    query = f"{_article(a)} without {_article(b)}"
    result = index.query(query, k=k, candidates=len(index.store))
    hits = result.hits
    explained = explain_hits(plugin, result)
    shown = [_shown(objects, h) for h in hits]
    shows_b = [b in seen for _, seen in shown]
    relevant = sum(a in objects[n] and b not in objects[n] for n in names)
    print(f'"{query}": {relevant} of {len(names)} clips and scenes show {a} without {b}')
    print(f"  concept dimensions: {'; '.join(_legend(explained))}")
    for rank, (hit, (name, seen), has_b) in enumerate(zip(hits, shown, shows_b, strict=True),
                                                      1):
        print(f"  {rank}. {hit.score:.4f}  {name}  objects: {', '.join(sorted(seen))}"
              f"{'  <- shows ' + b if has_b else ''}")
        (line,) = plugin.readable({"explain": _numbered(explained[rank - 1])})
        print(f"       {line}")
    plain = index.search(_article(a), k=k, candidates=len(index.store))
    plain_b = sum(b in _shown(objects, h)[1] for h in plain)
    print(f"{sum(shows_b)} of {len(hits)} results show {b} ({plain_b} of {len(plain)} for "
          f'the plain query "{_article(a)}")'
          + (" (the quick model is a smoke test, not a result)" if quick else ""))
    path = out / "exclusion.json"
    path.write_text(json.dumps({"query": query, "a": a, "b": b, "head": str(head_path),
                                "results_showing_b": sum(shows_b),
                                "plain_results_showing_b": plain_b, "results": [
                                    {**h.as_dict(), "shows_b": s, "explain": e}
                                    for h, s, e in zip(hits, shows_b, explained, strict=True)]},
                               indent=1))
    return path


def _legend(explained: list[dict]) -> list[str]:
    """Every concept dimension the explanations name, with its words, once."""
    named = [f"{d['dimension']} ({', '.join(d['words']) or '-'})" for e in explained
             for d in (*e["matched_words"], *e["excluded_empty_words"])]
    return list(dict.fromkeys(named))


def _numbered(explained: dict) -> dict:
    """An explanation whose dimensions are named by number alone (their words: the legend)."""
    def numbers(named: list[dict]) -> list[dict]:
        return [{**d, "words": []} for d in named]

    return {**explained, "matched_words": numbers(explained["matched_words"]),
            "excluded_empty_words": numbers(explained["excluded_empty_words"])}


def _article(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun

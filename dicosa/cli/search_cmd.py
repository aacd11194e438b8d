"""``dicosa search INDEX "a man is skiing"``: rank an index's videos for a query.

The index opens with everything it recorded (:func:`dicosa.index.open_index`: the model and
every plugin); options only override: ``--head``/``--concepts``/``--exclusion-set``/
``--mul2vec``/``--fusion`` attach (and record) another plugin in place of the recorded one,
``--no-fusion`` searches without the recorded fusion and leaves its record.
"""

from __future__ import annotations

import argparse
import json

from .common import model_options, options, positive_int

__all__ = ["add_parser", "run"]

_WEIGHTS = ("beta_semantic", "beta_title", "trust")


def add_parser(commands) -> None:
    p = commands.add_parser("search", help="rank the videos of an index for a text query")
    p.add_argument("index", help="index folder written by 'index'")
    p.add_argument("query", help="the text to search for")
    p.add_argument("--mul2vec", metavar="HEAD.pt",
                   help="fuse DiCoSA with a trained Mul2vec head (finds text-only entries)")
    p.add_argument("--fusion", action="store_true",
                   help="late fusion with the titles (no head): DiCoSA + beta * title match")
    p.add_argument("--beta-semantic", type=float, default=None,
                   help="weight of the Mul2vec part (default 0.2)")
    p.add_argument("--beta-title", type=float, default=None,
                   help="weight of the title part (default 0.2 without a head, 0 with one)")
    p.add_argument("--trust", type=float, default=None,
                   help="how far a missing part follows the part a row has (default 0.5)")
    p.add_argument("--no-fusion", action="store_true",
                   help="search without the fusion the index recorded (the record stays)")
    p.add_argument("--explain", action="store_true",
                   help="why each result ranks where it does: the concept dimensions it "
                        "matched (concepts head), its score parts (fusion) and the words it "
                        "shares with the query (lexical head)")
    p.add_argument("--mode", choices=("dense", "lexical", "bow", "hybrid"), default=None,
                   help="which first stage proposes candidates: dense, lexical (the head's "
                        "query on the sparse stage), bow (the query's own words, no network) "
                        "or hybrid (dense and lexical united; the default with a lexical "
                        "head, else dense)")
    p.add_argument("--source", default=None,
                   help="what the query is matched against: visual (the pictures, DiCoSA), "
                        "subtitles, speech, screen (on-screen text), text (those three), all "
                        "(the default where the index has text), or several comma-separated; "
                        "\"quoted words\" match a line literally")
    p.add_argument("-k", type=positive_int, default=10, help="number of results")
    p.add_argument("--candidates", type=positive_int, default=1000,
                   help="videos the first stage proposes for DiCoSA to rerank (default 1000)")
    p.add_argument("--exhaustive", action="store_true",
                   help="score every video with DiCoSA (the reference; slow on large indexes)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--moments", action="store_true",
                   help="list the best moments (time ranges; several may come from one long "
                        "video) rather than videos")
    p.add_argument("--exclude", action="append", default=[], metavar="B",
                   help="leave out videos showing B (repeatable; needs a concepts head)")
    p.add_argument("--concepts", metavar="HEAD.pt",
                   help="a concepts head: answers 'A without B' and --exclude; recorded in "
                        "the index, so later searches use it without this option")
    p.add_argument("--head", metavar="HEAD.pt",
                   help="a lexical head instead of the one the index recorded (e.g. its file "
                        "moved); recorded in its place")
    p.add_argument("--exclusion-set", action="append", default=[], metavar="KEY=VALUE",
                   help="an ExclusionConfig field, recorded: the default demote rule's "
                        "presence_ratio, demotion, window, code_threshold, code_weight, depth; "
                        "method=tiers for the paper's path (top_k_results, mass_fraction, "
                        "candidates, presence_threshold); docs/heads.md")
    p.add_argument("--no-strict", action="store_true",
                   help="warn instead of failing when the model differs from the index's")
    model_options(p, None)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..index import open_index
    from ..search.query import QueryError

    if not args.query.strip():
        raise QueryError("the query is empty: give the text to search for")
    if args.no_fusion and (args.mul2vec is not None or args.fusion):
        raise QueryError("--no-fusion searches without fusion: drop --mul2vec/--fusion, or "
                         "--no-fusion")
    model = None
    if args.checkpoint is not None or args.config is not None:
        from ..loading import load_model

        model = load_model(args.checkpoint, args.config, args.set, towers="text")[0]
    index = open_index(args.index, model, strict=not args.no_strict, skip=_overridden(args),
                       towers="text")
    _apply_overrides(index, args)
    if args.exclude and "concepts" not in index.plugins:
        raise QueryError("--exclude needs a concepts head: add --concepts HEAD.pt (train one "
                         "with 'dicosa heads train concepts')")
    if args.explain and not index.plugins:
        raise QueryError("--explain needs a head to explain: --concepts HEAD.pt (exclusion), "
                         "--mul2vec HEAD.pt / --fusion (score parts) or an index built with "
                         "--head HEAD.pt (words)")
    mode = _mode(index, args)
    candidates = None if args.exhaustive else args.candidates
    result = index.query(args.query, k=args.k, candidates=candidates, exclude=args.exclude,
                         mode=mode, source=args.source)
    explained = ([result.explain(i) for i in range(len(result.hits))] if args.explain
                 else [])
    text = index.plugins.get("text")
    lines = [text.matched(result, i) if text is not None else []
             for i in range(len(result.hits))]
    if args.moments:
        _print_moments(args, index, result, candidates, text)
    elif args.json:
        _print_json(args, index, result, candidates, explained, lines)
    else:
        _print_table(args, index, result, candidates, explained, lines)
    return 0


def _overridden(args: argparse.Namespace) -> set[str]:
    """Recorded plugins the options replace (or, --no-fusion, leave out)."""
    skip = set()
    if args.head:
        skip.add("lexical")
    if args.concepts or args.exclusion_set:
        skip.add("concepts")
    if (args.no_fusion or args.mul2vec or args.fusion
            or any(getattr(args, w) is not None for w in _WEIGHTS)):
        skip.add("fusion")
    return skip


def _apply_overrides(index, args: argparse.Namespace) -> None:
    from ..index.plugins import recorded_file
    from ..plugins import ExclusionPlugin, FusionPlugin, LexicalPlugin
    from ..plugins.exclusion import settings_config

    if args.head:  # recorded in place of the old one
        index.use(LexicalPlugin(args.head), wait=False)
    if args.concepts or args.exclusion_set:
        record = index.meta.get("concepts") or {}
        head = args.concepts or recorded_file(record, "concepts", "--concepts")
        if head is None:
            raise ValueError("--exclusion-set changes a concepts head's settings: add "
                             "--concepts HEAD.pt")
        config = settings_config(record, **options(args.exclusion_set))
        index.use(ExclusionPlugin(head, config), wait=False)
    if not args.no_fusion and "fusion" in _overridden(args):
        recorded = index.meta.get("fusion")
        head = args.mul2vec
        if head is None and not args.fusion:
            if recorded is None:
                return  # weights alone, and no fusion recorded: nothing to fuse
            head = recorded_file(recorded, "fusion", "--mul2vec")  # None: late fusion
        same_kind = recorded is not None and (recorded.get("head") is None) == (head is None)
        weights = {w: recorded.get(w) if getattr(args, w) is None and same_kind
                   else getattr(args, w) for w in _WEIGHTS}
        index.use(FusionPlugin(head, **weights), wait=False)


def _mode(index, args: argparse.Namespace) -> str:
    """``--mode``, by default hybrid where the index has a lexical stage, else dense."""
    from ..search.query import QueryError

    lexical = "lexical" in index.plugins
    if args.mode is None:
        return "hybrid" if lexical else "dense"
    if args.mode != "dense" and not lexical:
        raise QueryError(f"--mode {args.mode} needs an index with a lexical head: build it with "
                         "'dicosa index FOLDER --out INDEX --head HEAD.pt'")
    return args.mode


def _split(explained: list[dict]) -> tuple[list[dict], list[dict] | None]:
    """Per hit: the exclusion's and the words' keys side by side; the fusion parts apart (the
    text plugin's matched line is printed for every hit, with or without --explain)."""
    merged = [{**e.get("concepts", {}), **e.get("lexical", {})} for e in explained]
    parts = [e["fusion"] for e in explained if "fusion" in e] or None
    return (merged if any(merged) else []), parts


def _print_json(args, index, result, candidates, explained, lines) -> None:
    from ..plugins.text import ranked_by

    merged, parts = _split(explained)
    stats = {**result.times, "stage": result.stage, "mode": result.mode,
             "candidates": [result.candidates], "truncated": [result.truncated]}
    print(json.dumps({"query": args.query, "index": str(args.index), "mode": result.mode,
                      "exclude": args.exclude, "candidates": candidates, "stats": stats,
                      "ranked_by": ranked_by(result), "truncated": result.truncated,
                      "results": [{"rank": r, **hit.as_dict(),
                                   **({"explain": merged[r - 1]} if merged else {}),
                                   **({"line": lines[r - 1][0], "lines": lines[r - 1]}
                                      if lines[r - 1] else {})}
                                  for r, hit in enumerate(result.hits, 1)],
                      **({"fusion": parts} if parts is not None else {})}))


def _print_moments(args, index, result, candidates, text) -> None:
    """``--moments``: the best time ranges, each with its matched line, as a table or
    (``--json``) a list."""
    from ..plugins.text import describe, format_line, ranked_by
    from ..search.moment import format_span

    found = result.top_moments(args.k)
    said = [text.line_at(result, m.row) if text is not None else None for _, _, m in found]
    ranked = ranked_by(result)
    if args.json:
        print(json.dumps({"query": args.query, "index": str(args.index), "mode": result.mode,
                          "candidates": candidates, "truncated": result.truncated,
                          "ranked_by": ranked,
                          "moments": [{"rank": r, "path": path, "id": video, **m.as_dict(),
                                       **({"line": line} if line else {})}
                                      for r, ((path, video, m), line) in enumerate(
                                          zip(found, said, strict=True), 1)]}))
        return
    print(f'top {len(found)} moments of {len(index)} videos for "{args.query}" '
          f"({describe(ranked)})")
    print(f"{'rank':>4}  {'score':>8}  {'moment':<13}  path")
    for rank, ((path, _, moment), line) in enumerate(zip(found, said, strict=True), 1):
        print(f"{rank:>4}  {moment.score:>8.4f}  {format_span(moment.start, moment.end):<13}  "
              f"{path}")
        if line:
            print(f"{'':>16}{format_line(line)}")


def _print_table(args, index, result, candidates, explained, lines) -> None:
    from ..plugins.exclusion import format_explanation
    from ..plugins.fusion import format_parts
    from ..plugins.lexical import format_words
    from ..plugins.text import format_line
    from ..search.moment import format_span

    if result.truncated:
        print(f"note: the query is longer than the {index.model.config.max_words} tokens the "
              "model reads; it was searched as far as the model reads it")
    print(f'top {len(result.hits)} of {len(index)} videos for "{args.query}" '
          f"({_how(result, candidates)})")
    print(f"{'rank':>4}  {'score':>8}  {'stage':<10}  {'moment':<13}  path")
    for rank, hit in enumerate(result.hits, 1):
        when = format_span(hit.start, hit.end)
        print(f"{rank:>4}  {hit.score:>8.4f}  {hit.stage:<10}  {when:<13}  {hit.path}")
        for moment in hit.moments[1:]:
            print(f"{'':>4}  {moment.score:>8.4f}  {'':<10}  "
                  f"{format_span(moment.start, moment.end):<13}  (another moment)")
        said = explained[rank - 1] if explained else {}
        if said.get("concepts"):
            print(f"{'':>16}{format_explanation(said['concepts'])}")
        if said.get("lexical"):
            print(f"{'':>16}{format_words(said['lexical'])}")
        for line in lines[rank - 1]:
            print(f"{'':>16}{format_line(line)}")
    parts = [e["fusion"] for e in explained if "fusion" in e]
    if parts:
        print(format_parts(parts))


def _how(result, candidates: int | None) -> str:
    """How the hits were found and what ranked them, as the table's header says it: every
    row scored, or which first stage proposed how many candidates; then DiCoSA, the words,
    or both (:func:`~dicosa.plugins.text.ranked_by`)."""
    from ..plugins.text import describe, ranked_by

    ranked = ranked_by(result)
    if candidates is None:
        return "every video scored by DiCoSA" + (
            "" if ranked["by"] == "pictures" else f"; {describe(ranked)}")
    if result.stage == "all":  # the collection is no larger than the candidates asked for
        return f"all {result.candidates} rows {describe(ranked)}"
    stage = ("the first stage" if result.stage == "first stage"  # labelled row by row
             else f"the {result.stage} stage")
    return f"{result.candidates} candidates from {stage} ({result.mode} mode) {describe(ranked)}"

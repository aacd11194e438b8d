"""``dicosa search INDEX "a man is skiing"``: rank an index's videos for a query.

The index opens with everything it recorded (:func:`dicosa.index.open_index`: the model and
every plugin); each plugin reads the options it declares
(:meth:`~dicosa.index.plugins.IndexPlugin.from_options`), and the index checks the request
and says what its plugins add to each hit.
"""

from __future__ import annotations

import argparse
import json

from .common import model_options, options, positive_int

__all__ = ["add_parser", "run"]


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
    p.add_argument("--mode", default=None,
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
    model = None
    if args.checkpoint is not None or args.config is not None:
        from ..loading import load_model

        model = load_model(args.checkpoint, args.config, args.set, towers="text")[0]
    index = open_index(args.index, model, strict=not args.no_strict, towers="text",
                       options={**vars(args), "exclusion_set": options(args.exclusion_set)})
    index.check_request(args.exclude, args.mode, source=args.source)
    if args.explain and not index.plugins:
        raise QueryError("--explain needs a head to explain: --concepts HEAD.pt (exclusion), "
                         "--mul2vec HEAD.pt / --fusion (score parts) or an index built with "
                         "--head HEAD.pt (words)")
    candidates = None if args.exhaustive else args.candidates
    result = index.query(args.query, k=args.k, candidates=candidates, exclude=args.exclude,
                         mode=args.mode or index.default_mode, source=args.source)
    if args.moments:
        _print_moments(args, index, result, candidates)
    elif args.json:
        _print_json(args, index, result, candidates)
    else:
        _print_table(args, index, result, candidates)
    return 0


def _print_json(args, index, result, candidates) -> None:
    said = index.annotations
    stats = {**result.times, "stage": result.stage, "mode": result.mode,
             "candidates": [result.candidates], "truncated": [result.truncated]}
    print(json.dumps({"query": args.query, "index": str(args.index), "mode": result.mode,
                      "exclude": args.exclude, "candidates": candidates, "stats": stats,
                      **said.answer(result), "truncated": result.truncated,
                      "results": [{"rank": r, **hit.as_dict(), **said.hit(result, r - 1),
                                   **({"explain": said.explain(result, r - 1)}
                                      if args.explain else {})}
                                  for r, hit in enumerate(result.hits, 1)]}))


def _print_moments(args, index, result, candidates) -> None:
    """``--moments``: the best time ranges, each with what the plugins add to it (the matched
    line), as a table or (``--json``) a list."""
    from ..search.moment import format_span

    said = index.annotations
    found = result.top_moments(args.k)
    if args.json:
        print(json.dumps({"query": args.query, "index": str(args.index), "mode": result.mode,
                          "candidates": candidates, "truncated": result.truncated,
                          **said.answer(result),
                          "moments": [{"rank": r, "path": path, "id": video, **m.as_dict(),
                                       **said.row(result, m.row)}
                                      for r, (path, video, m) in enumerate(found, 1)]}))
        return
    print(f'top {len(found)} moments of {len(index)} videos for "{args.query}" '
          f"({_ranked(said.answer(result)['ranked_by'])})")
    print(f"{'rank':>4}  {'score':>8}  {'moment':<13}  path")
    for rank, (path, _, moment) in enumerate(found, 1):
        print(f"{rank:>4}  {moment.score:>8.4f}  {format_span(moment.start, moment.end):<13}  "
              f"{path}")
        for line in said.readable_row(result, moment.row):
            print(f"{'':>16}{line}")


def _print_table(args, index, result, candidates) -> None:
    from ..search.moment import format_span

    said = index.annotations
    if result.truncated:
        print(f"note: the query is longer than the {index.model.config.max_words} tokens the "
              "model reads; it was searched as far as the model reads it")
    print(f'top {len(result.hits)} of {len(index)} videos for "{args.query}" '
          f"({_how(result, candidates, said.answer(result)['ranked_by'])})")
    print(f"{'rank':>4}  {'score':>8}  {'stage':<10}  {'moment':<13}  path")
    for rank, hit in enumerate(result.hits, 1):
        when = format_span(hit.start, hit.end)
        print(f"{rank:>4}  {hit.score:>8.4f}  {hit.stage:<10}  {when:<13}  {hit.path}")
        for moment in hit.moments[1:]:
            print(f"{'':>4}  {moment.score:>8.4f}  {'':<10}  "
                  f"{format_span(moment.start, moment.end):<13}  (another moment)")
        for line in said.readable(result, rank - 1, args.explain):
            print(f"{'':>16}{line}")


def _how(result, candidates: int | None, ranked: dict) -> str:
    """How the hits were found and what ranked them (``ranked``: the answer's ``ranked_by``),
    as the table's header says it: every row scored, or which first stage proposed how many
    candidates; then DiCoSA, the words, or both."""
    if candidates is None:
        return "every video scored by DiCoSA" + (
            "" if ranked["by"] == "pictures" else f"; {_ranked(ranked)}")
    if result.stage == "all":  # the collection is no larger than the candidates asked for
        return f"all {result.candidates} rows {_ranked(ranked)}"
    stage = ("the first stage" if result.stage == "first stage"  # labelled row by row
             else f"the {result.stage} stage")
    return f"{result.candidates} candidates from {stage} ({result.mode} mode) {_ranked(ranked)}"


def _ranked(ranked: dict) -> str:
    """An answer's ``ranked_by`` in words: ``reranked by DiCoSA fused with the words of
    subtitles``."""
    sources = ", ".join(ranked["sources"])
    if ranked["by"] == "words":
        return f"ranked by the words of {sources} (BM25)"
    if ranked["by"] == "pictures and words":
        return f"reranked by DiCoSA fused with the words of {sources}"
    return "reranked by DiCoSA" + (f" (no line of {sources} matched)" if sources else "")

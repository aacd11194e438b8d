"""The service's answers as pydantic models: what ``/openapi.json`` publishes.

One model per JSON object the routes send, built from the same names as ``engine.py`` and
``app.py`` write. The routes send their dicts as they are (a search's answer is not passed
through FastAPI's encoder, which costs milliseconds); these models describe them, and
``tests/test_serve_schema.py`` validates live answers against the published schema. Every
model forbids fields it does not declare (``additionalProperties: false``), so a field the
server starts sending without its model here fails that test: add it here first.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ERROR_RESPONSES", "ErrorBody", "Health", "Hit", "Info", "Limits", "Moment",
           "MomentBest", "MomentFrame", "Partial", "QueryEcho", "Ready", "SearchAnswer",
           "VideoDetails", "errors"]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorBody(_Answer):
    """Every error the service answers (any status but media's 206/304): one sentence."""

    error: str = Field(description="what was wrong, as one sentence (never a traceback)")


class Health(_Answer):
    status: Literal["ok"]


class Ready(_Answer):
    ready: bool
    videos: int
    opened_at: str = Field(description="when the index snapshot was opened (ISO 8601, UTC)")
    reloads: int = Field(description="how often the index was reopened after a change")
    last_reload: str | None
    reload_error: str | None = Field(description="why the last reopening failed (the "
                                                 "previous snapshot is still served)")


class ModelInfo(_Answer):
    source: str | None = Field(description="the checkpoint's or config's file name")
    arch: str
    frames: int
    dim: int
    max_words: int


class Limits(_Answer):
    query_chars: int
    exclusions: int
    page: int
    depth: int
    candidates: int


class QueryCacheInfo(_Answer):
    capacity: int = Field(description="query texts whose encodings are kept (0: none)")
    size: int
    hits: int = Field(description="texts answered from the cache since this process opened "
                                  "the index")
    misses: int = Field(description="texts encoded since this process opened the index")


class TextInfo(_Answer):
    tower: Literal["float", "packed", "int8"] = Field(
        description="how queries are encoded: the model's text tower, the packed CPU tower "
                    "(same vectors), or its int8 variant (faster, not the same ranking)")
    cache: QueryCacheInfo


class ServerInfo(_Answer):
    pid: int = Field(description="the server process that answered")
    threads: int = Field(description="torch threads of the process that ranks (a ranker's "
                                     "while another ranker is busy)")
    max_batch: int = Field(description="searches ranked together at most (1: no batching)")
    rankers: int = Field(description="processes that rank this server's searches "
                                     "(dicosa serve --rankers; 0: this one)")
    chosen: Literal["options", "machine"] = Field(
        description="whether the options said where searches rank, or the service picked "
                    "it from the machine")
    why: str = Field(description="where searches rank and why, in words")


class Info(_Answer):
    videos: int
    model: ModelInfo
    plugins: dict[str, dict[str, Any]] = Field(
        description="what each plugin gives the index, by the name answers give its "
                    "explanations: words (a lexical head: its kind, sparse backend, words), "
                    "exclusion (a concepts head), fusion (title fusion: late or mul2vec, its "
                    "weights), text (sources: each text source a query can be matched "
                    "against, with its engine and the rows and lines the index holds of it)")
    modes: dict[str, str] = Field(description="search mode -> what it does")
    default_mode: str
    backend: str | None
    summary: str | None
    frame_protocol: dict[str, str]
    frame_dtype: Literal["float16", "int8"] = Field(description="how the store keeps frames")
    timeline_rows: int = Field(description="the most segments of a hit's video its timeline "
                                           "scores (dicosa serve --timeline-rows)")
    text: TextInfo
    frame_times: str
    opened_at: str
    limits: Limits
    version: str
    api_key: bool = Field(description="whether requests need the API key")
    server: ServerInfo


class Partial(_Answer):
    """What the decode of a partial video lost: it was indexed from the rest."""

    decoded: float | None = Field(description="seconds decoded (the video's duration here)")
    expected: float | None = Field(description="seconds its container states (null: unknown)")
    damage: str = Field(description="what was lost, as one sentence")


class VideoDetails(_Answer):
    id: int
    name: str = Field(description="the file's name (never its path)")
    title: str
    duration: float | None = Field(description="seconds")
    fps: float | None
    partial: Partial | None = Field(description="null for a video that decoded whole")


class MomentFrame(_Answer):
    frame: int = Field(description="the frame's place in the video's stored frames")
    time: float | None = Field(description="seconds into the video (null: unknown)")
    weight: float = Field(description="the frame's share of its best row's text-conditioned "
                                      "pooling (Eq. 1)")
    score: float | None = Field(description="DiCoSA's score of the best row (segment) holding "
                                            "the frame")


class MomentBest(_Answer):
    """The frame shown for the hit (its thumbnail): the heaviest scored frame of the hit's
    best moment, or, where a line decided that moment, within the line's time."""

    frame: int
    time: float | None
    weight: float
    by: Literal["pictures", "words"] = Field(description="what placed it: the pictures, or "
                                                         "the line that decided the moment")


class TimeRange(_Answer):
    """A moment: a time range of the video (its best row joined with the overlapping rows of
    its shot that match) and its best row's score."""

    start: float | None = Field(description="seconds into the video (null: unknown)")
    end: float | None
    score: float
    row: int = Field(description="its best row (segment): 'more like this' from a moment "
                                 "takes it as row=")


class MatchedLine(_Answer):
    """A line of the video's text (subtitles, speech, on-screen text) that the query matched."""

    text: str = Field(description="the line, or at most 240 characters of it around the "
                                  "query's words (an ellipsis where cut)")
    start: float | None = Field(description="seconds into the video")
    end: float | None
    source: str = Field(description="subtitles, speech or screen")
    bm25: float = Field(description="the line's BM25 for the query (higher is better)")
    row: int = Field(description="the row (segment) the line belongs to")
    text_rank: int | None = Field(description="the row's rank among the text matches")
    words: list[str] = Field(description="the query's words the line holds")


class Moment(_Answer):
    """The video's relevance over its length: its stored frames (a long video's thinned to at
    most 240), each with the score of the best row holding it, and the best frame. A video of
    more than 16 rows (``--timeline-rows``) has 16 of them scored (its moments' rows and others
    spread evenly over it); the frames of the others are not listed."""

    frames: list[MomentFrame]
    best: MomentBest
    moments: list[TimeRange] = Field(description="the video's best moments that do not "
                                                 "overlap, among the rows scored")
    rows: int = Field(description="the video's rows (segments)")
    scored_rows: int = Field(description="the rows scored for this timeline: all of them, or "
                                         "16 of a longer video (--timeline-rows)")


class Hit(_Answer):
    rank: int
    id: int
    name: str
    title: str
    duration: float | None
    fps: float | None
    partial: Partial | None = Field(description="null for a video that decoded whole")
    score: float | None = Field(description="the final score (null where not finite)")
    dicosa: float | None = Field(description="DiCoSA's score of the pair")
    stage: str = Field(description="the first stage that proposed the video")
    stage_score: float | None
    stage_scores: dict[str, float | None] | None
    row: int = Field(description="the row (segment) of the video that scored best")
    moments: list[TimeRange] = Field(description="the video's best moments among the ranked "
                                                 "candidates, not overlapping, best first")
    moment: Moment | None = Field(description="null for a video indexed from its title alone")
    line: MatchedLine | None = Field(None, description="with a text index: the line that "
                                                       "matched best (null: none did)")
    lines: list[MatchedLine] | None = Field(None, description="with a text index: the lines "
                                                              "that matched, one per moment "
                                                              "(best first; at most 3)")
    explain: dict[str, Any] | None = Field(
        None, description="with explain=true: words, exclusion and fusion parts by plugin")
    video: str | None = Field(description="the file's stream URL (null: it may not be served)")
    thumbnail: str | None = Field(description="a JPEG of the best moment")
    media_type: str | None
    media_token: str | None = Field(description="token=... for links to other moments "
                                                "(with an API key)")


class QueryEcho(_Answer):
    q: str | None = Field(description="the text searched (null for more-like-this)")
    exclude: list[str]
    text: str | None = Field(description="what was searched after parsing 'A without B'")
    without: list[str]
    mode: str | None
    k: int
    offset: int
    candidates: int
    explain: bool
    like: int | None = Field(None, description="more-like-this: the seed video's id")
    like_row: int | None = Field(None, description="more-like-this from a moment: its row")
    source: str | None = Field(None, description="what the query was matched against, as "
                                                 "asked (null: the index's default, all)")


class RankedBy(_Answer):
    by: Literal["pictures", "words", "pictures and words"] = Field(
        description="what ordered the hits: DiCoSA's scores, the words' BM25, or both fused "
                    "(words count where a candidate matched a line)")
    sources: list[str] = Field(description="the text sources the query was matched against")


class SearchAnswer(_Answer):
    """A page of a ranking: a search's, or more-like-this."""

    query: QueryEcho
    videos: int = Field(description="videos in the index")
    reranked: int = Field(description="candidates DiCoSA reranked")
    stage: str
    ranked_by: RankedBy
    truncated: bool = Field(description="the query was longer than the model reads")
    batch: int = Field(description="searches ranked together with this one")
    more: bool = Field(description="whether a next page exists")
    times_ms: dict[str, float] = Field(description="milliseconds per step: encode (the query's "
                                                   "vector), words (its text search), "
                                                   "first_stage, rerank (DiCoSA), hooks, top, "
                                                   "moments, total")
    notes: list[str]
    hits: list[Hit]


_SAID = {
    400: "a parameter the service cannot honour (one sentence says which)",
    401: "the API key is needed: X-API-Key, Authorization: Bearer, the login cookie or, for "
         "media, a token",
    404: "no video with this id can be served, or nothing at this address",
    416: "the byte range lies past the end of the file",
    500: "the service failed; its log says why",
    503: "the index is not open yet (Retry-After says when to ask again)",
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": said} for status, said in _SAID.items()}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The error answers of a route (for FastAPI's ``responses=``)."""
    return {status: ERROR_RESPONSES[status] for status in statuses}

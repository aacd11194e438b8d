"""What the service answers with a status other than 200: each error is one sentence."""

from __future__ import annotations

from ..search.query import QueryError

__all__ = ["BAD_REQUESTS", "NotReady", "ServeError", "UnknownMoment", "UnknownVideo"]


class ServeError(ValueError):
    """A request the service refuses (HTTP 400): a parameter it cannot honour."""


class UnknownVideo(LookupError):
    """No live video has the requested id, or its file may not be served (HTTP 404)."""

    def __init__(self, video_id: object):
        text = str(video_id)
        shown = text if len(text) <= 40 else text[:37] + "..."
        super().__init__(f"no video with the id '{shown}' can be served")


class UnknownMoment(LookupError):
    """A row id that is not one of the video's live rows (HTTP 404)."""

    def __init__(self, row: int, video: int):
        super().__init__(f"row {row} is not a moment of video {video}")


class NotReady(RuntimeError):
    """The index is still being opened (HTTP 503)."""


# Raised by the search engine for a request's own content: answered as HTTP 400.
BAD_REQUESTS: tuple[type[Exception], ...] = (ServeError, QueryError)

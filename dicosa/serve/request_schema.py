"""What a request may hold, as the JSON Schema ``/openapi.json`` publishes for each parameter.

The routes check their parameters themselves and answer 400 with one sentence
(``app._checked``, ``Engine.check``); this module states the same limits in the schema, so
that a request the schema allows is never refused as invalid. FastAPI's generated parameter
schemas (bare types) are replaced by these; their defaults are kept. Ids (``video_id``,
``row``) are digits: an id of a video or moment that does not exist is 404, not 400.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..search.query import QUERY_PATTERN

__all__ = ["IndexFacts", "request_fields", "state_limits"]

ID_PATTERN = r"^[0-9]{1,18}$"


@dataclass(frozen=True)
class IndexFacts:
    """What of the index being served decides which requests it can answer."""

    modes: tuple[str, ...] = ()  # its search modes (empty: not known, any text)
    leaves_out: bool = False  # a hook answers "A without B": searches may leave things out
    # the search options its plugins take (the text plugin's source) -> their JSON Schemas
    options: dict[str, dict] = field(default_factory=dict)


def request_fields(limits: dict[str, int], facts: IndexFacts) -> dict[str, dict]:
    """The schema of every request field the service checks, by its name (query parameters
    and the search body share them). ``limits``: :class:`dicosa.serve.app.Limits` as a dict."""
    chars, depth = limits["query_chars"], limits["depth"]
    excluded = ({"maxItems": limits["exclusions"],
                 "description": f"things to leave out, at most {limits['exclusions']}"}
                if facts.leaves_out else
                {"maxItems": 0, "description": "this index has no concepts head: nothing can "
                                               "be left out"})
    return {
        "q": {"type": "string", "minLength": 1, "maxLength": chars, "pattern": QUERY_PATTERN,
              "description": f"what to find, at most {chars} characters; 'A without B' "
                             "(or 'but not', 'excluding', 'except') leaves B out, and each "
                             "part needs words"},
        "exclude": {"type": "array", "items": {"type": "string", "maxLength": chars},
                    **excluded},
        "k": {"type": "integer", "minimum": 1, "maximum": limits["page"],
              "description": f"hits per page (a page ends at rank {depth})"},
        "offset": {"type": "integer", "minimum": 0, "maximum": depth - 1,
                   "description": f"the rank the page starts after: paging reaches the first "
                                  f"{depth} results"},
        "candidates": {"type": "integer", "minimum": 1, "maximum": limits["candidates"],
                       "description": "rows the first stage proposes for DiCoSA to rerank"},
        "mode": ({"type": "string", "enum": [*facts.modes, ""],
                  "description": "which first stages propose candidates (empty: the "
                                 "index's default)"}
                 if facts.modes else {"type": "string"}),
        **facts.options,
        "explain": {"type": "boolean"},
        "video_id": {"type": "string", "pattern": ID_PATTERN,
                     "description": "a video's id (its first row's): digits"},
        "row": {"type": "string", "pattern": ID_PATTERN,
                "description": "one of the video's rows (a moment its hit names): digits"},
        "t": {"type": "number", "minimum": 0, "maximum": 86_400,
              "description": "seconds into the video"},
    }


def state_limits(schema: dict[str, Any], fields: dict[str, dict]) -> None:
    """Put ``fields`` in place of the generated schemas of the parameters and body properties
    of the same names (in ``schema``, an OpenAPI document), keeping their defaults; a
    property that may be null stays nullable."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", ()):
                if parameter["name"] in fields:
                    parameter["schema"] = _merged(parameter["schema"], fields[parameter["name"]],
                                                  nullable=False)
    for model in schema.get("components", {}).get("schemas", {}).values():
        properties = model.get("properties", {}) if model.get("title") == "SearchBody" else {}
        for name, generated in properties.items():
            if name in fields:
                properties[name] = _merged(generated, fields[name], nullable=True)


def _merged(generated: dict, stated: dict, nullable: bool) -> dict:
    """``stated`` with the generated schema's default and title; with ``nullable`` (a JSON
    body's field), still null where the generated one allowed null. A query parameter is
    never null: leaving it out is how null is said there."""
    kept = {key: generated[key] for key in ("default", "title") if key in generated}
    if nullable and any(part.get("type") == "null" for part in generated.get("anyOf", ())):
        return {"anyOf": [stated, {"type": "null"}], **kept}
    return {**stated, **kept}

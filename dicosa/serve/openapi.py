"""``/openapi.json`` as the service really answers, and ``/docs`` served without a network.

FastAPI's generated schema is corrected in four ways: its 422 validation answers are removed
(the service answers a bad parameter with 400 ``{"error": ...}``, :mod:`.schemas`); every
parameter states the limits the service enforces (:mod:`.request_schema`); with an API key,
the ways to show it are declared as security schemes (so Swagger UI has an Authorize button)
and every operation lists 401; with a Host check, every operation lists the 400 it answers
to a request for another name.

``/docs`` is Swagger UI from the ``swagger-ui-bundle-v2`` package, its script and stylesheet
served by the app itself under ``/docs/assets`` (FastAPI's default page loads them from a
CDN, blank offline).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from .request_schema import state_limits
from .schemas import ERROR_RESPONSES, ErrorBody
from .security import COOKIE

__all__ = ["ASSETS", "DOCS_CSP", "MEDIA_OPERATIONS", "install_docs", "openapi_schema"]

ASSETS = "/docs/assets"
# Swagger UI's page starts itself with an inline script; nothing it loads comes from elsewhere.
DOCS_CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
            "script-src 'self' 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'; "
            "base-uri 'none'; form-action 'self'")
# Operations a signed media token in the URL opens (security.Guard).
MEDIA_OPERATIONS = ("/api/videos/{video_id}/stream", "/api/videos/{video_id}/thumb")

_SCHEMES = {
    "ApiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key",
               "description": "the key given to `dicosa serve --api-key`"},
    "Bearer": {"type": "http", "scheme": "bearer",
               "description": "the same key as `Authorization: Bearer KEY`"},
    "Session": {"type": "apiKey", "in": "cookie", "name": COOKIE,
                "description": "set by POST /login once the key is typed in"},
    "MediaToken": {"type": "apiKey", "in": "query", "name": "token",
                   "description": "signed, short-lived, for one video's stream and "
                                  "thumbnails: the search answer's media links carry it"},
}


def openapi_schema(app: FastAPI, *, api_key: bool, host_check: bool,
                   fields: dict[str, dict] | None = None) -> dict[str, Any]:
    """The schema of ``app``'s routes as the service answers them (module docstring);
    ``fields``: :func:`.request_schema.request_fields` of the limits and the index served."""
    schema = get_openapi(title=app.title, version=app.version, description=app.description,
                         routes=app.routes)
    state_limits(schema, fields or {})
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas.setdefault("ErrorBody", ErrorBody.model_json_schema())
    added = {**({401: ERROR_RESPONSES[401]} if api_key else {}),
             **({400: ERROR_RESPONSES[400]} if host_check else {})}
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            answers = operation.setdefault("responses", {})
            answers.pop("422", None)
            for status, said in added.items():
                answers.setdefault(str(status), _error_answer(said["description"]))
            if api_key:
                operation["security"] = _requirements(path in MEDIA_OPERATIONS)
    if api_key:
        components["securitySchemes"] = dict(_SCHEMES)
    return schema


def _error_answer(description: str) -> dict:
    return {"description": description, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/ErrorBody"}}}}


def _requirements(media: bool) -> list[dict]:
    """Any one of the schemes opens an operation (OpenAPI: a list is alternatives)."""
    names = ["ApiKey", "Bearer", "Session", *(["MediaToken"] if media else [])]
    return [{name: []} for name in names]


def install_docs(app: FastAPI) -> None:
    """``/docs`` (Swagger UI) with its files served from the installed package."""
    try:
        from swagger_ui_bundle import swagger_ui_path
    except ImportError:  # the serve extra installs it
        swagger_ui_path = None
    if swagger_ui_path is not None:
        app.mount(ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs() -> Response:
        if swagger_ui_path is None:
            return JSONResponse({"error": "the /docs page needs swagger-ui-bundle-v2 (pip "
                                          "install 'dicosa[serve]'); the schema is at "
                                          "/openapi.json"}, status_code=404)
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} API",
                                   swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS}/favicon-32x32.png")

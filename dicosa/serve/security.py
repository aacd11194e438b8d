"""The API key, and what stands for it where a browser cannot send a header.

With a key set, every request must show one of:

- the key itself, in ``X-API-Key: KEY`` or ``Authorization: Bearer KEY`` (scripts, curl);
- the session cookie the login page sets once the key is typed in (the page, and the
  ``<video>`` and ``<img>`` requests it makes: same site, so the cookie goes along);
- for one video's stream or thumbnails only, a signed token in the URL (``?token=``) that the
  search answer puts in its media links: valid for that video for ``token_ttl_s`` seconds, so a
  link handed to a player that has neither the key nor the cookie works, briefly.

Cookies and tokens are ``EXPIRY.SIGNATURE``, an HMAC-SHA256 of what they grant and until when,
under a key derived from the API key: nothing is stored on the server, the key never leaves
it, and a new key invalidates them all.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Callable, Mapping

__all__ = ["COOKIE", "Guard", "safe_next"]

COOKIE = "dicosa_session"
_MEDIA_PATH = re.compile(r"^/api/videos/([0-9]{1,18})/(?:stream|thumb)$")


class Guard:
    """Checks requests against the API key (None: every request passes)."""

    def __init__(self, api_key: str | None, *, token_ttl_s: int = 600,
                 session_ttl_s: int = 12 * 3600, clock: Callable[[], float] = time.time):
        self.api_key = api_key or None
        self.token_ttl_s, self.session_ttl_s, self.clock = token_ttl_s, session_ttl_s, clock
        self._secret = (hmac.new(self.api_key.encode(), b"dicosa serve signing key",
                                 hashlib.sha256).digest() if self.api_key else b"")

    @property
    def enabled(self) -> bool:
        return self.api_key is not None

    def is_key(self, candidate: str | None) -> bool:
        return bool(self.api_key and candidate) and hmac.compare_digest(
            candidate.encode(), self.api_key.encode())

    def session(self) -> str:
        """A new session cookie value."""
        return self._token("session", self.session_ttl_s)

    def media_token(self, video_id: int) -> str:
        """A token for video ``video_id``'s stream and thumbnails."""
        return self._token(f"video {video_id}", self.token_ttl_s)

    def allows(self, path: str, headers: Mapping[str, str], cookies: Mapping[str, str],
               query: Mapping[str, str]) -> bool:
        """Whether a request for ``path`` shows the key, a session or a media token."""
        if not self.enabled:
            return True
        bearer = headers.get("authorization", "")
        if self.is_key(headers.get("x-api-key")) or (
                bearer[:7].lower() == "bearer " and self.is_key(bearer[7:].strip())):
            return True
        if self._valid(cookies.get(COOKIE), "session"):
            return True
        media = _MEDIA_PATH.match(path)
        return bool(media) and self._valid(query.get("token"), f"video {int(media.group(1))}")

    def _token(self, grant: str, ttl_s: int) -> str:
        expiry = int(self.clock()) + ttl_s
        return f"{expiry}.{self._sign(grant, expiry)}"

    def _sign(self, grant: str, expiry: int) -> str:
        return hmac.new(self._secret, f"{grant}|{expiry}".encode(), hashlib.sha256).hexdigest()

    def _valid(self, token: str | None, grant: str) -> bool:
        if not token or token.count(".") != 1:
            return False
        expiry, signature = token.split(".")
        if not expiry.isdigit() or int(expiry) < self.clock():
            return False
        return hmac.compare_digest(signature, self._sign(grant, int(expiry)))


def safe_next(target: str | None) -> str:
    """Where the login page may send the browser afterwards: a path of this site only."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target

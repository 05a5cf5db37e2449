"""Who is asking, and the CSRF token of their forms: a session in a signed cookie.

Every visitor gets a session, logged in or not, so that every form (the login form too)
carries a token an attacker's page cannot read: a POST whose token is not its session's is
refused. The cookie is signed with a key made at start, so a restart logs everyone out; it
is HttpOnly and SameSite=Strict, and holds no secret but the token.

A user is the session's (after ``/login`` checked a password of ``web.auth.users``), or the
name a trusted reverse proxy sets in ``web.auth.proxy_header``, believed only from the
addresses of ``web.auth.trusted_proxies``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass

from ..config import WebAuthConfig

COOKIE = "pgtaskd_session"
LIFETIME = 12 * 3600.0
MAX_USER_LENGTH = 100


@dataclass(frozen=True)
class Session:
    user: str | None
    csrf: str
    expires: float
    fresh: bool = False
    """Made for this request: the response must set its cookie."""
    via_proxy: bool = False


class Sessions:
    def __init__(self, auth: WebAuthConfig, key: bytes | None = None):
        self.auth = auth
        self._key = key or os.urandom(32)

    def load(self, cookie: str | None, client_host: str | None,
             proxy_user: str | None) -> Session:
        """The request's session: its cookie's if that is genuine and current, else a new
        one, logged out; with the user a trusted proxy names, if any."""
        session = self._verify(cookie) if cookie else None
        if session is None:
            session = self.new(None)
        user = self._proxy_user(client_host, proxy_user)
        if user is not None:
            return Session(user, session.csrf, session.expires, session.fresh, via_proxy=True)
        if session.user is not None and session.user not in self.auth.users:
            # Removed from the config since: the cookie no longer names a user.
            return Session(None, session.csrf, session.expires, session.fresh)
        return session

    def new(self, user: str | None) -> Session:
        return Session(user, secrets.token_urlsafe(24), time.time() + LIFETIME, fresh=True)

    def cookie(self, session: Session) -> str:
        body = base64.urlsafe_b64encode(json.dumps(
            {"u": session.user, "c": session.csrf, "e": int(session.expires)},
            separators=(",", ":")).encode()).decode()
        return f"{body}.{self._sign(body)}"

    def _sign(self, body: str) -> str:
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()

    def _verify(self, cookie: str) -> Session | None:
        body, _, signature = cookie.partition(".")
        if len(cookie) > 1000 or not hmac.compare_digest(signature, self._sign(body)):
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(body))
            user, csrf, expires = data["u"], data["c"], float(data["e"])
        except (binascii.Error, ValueError, KeyError, TypeError):
            return None
        if expires < time.time() or not isinstance(csrf, str):
            return None
        return Session(user if isinstance(user, str) else None, csrf, expires)

    def _proxy_user(self, client_host: str | None, value: str | None) -> str | None:
        if self.auth.proxy_header is None or value is None or client_host is None:
            return None
        if client_host not in self.auth.trusted_proxies:
            return None
        value = value.strip()
        if not value or len(value) > MAX_USER_LENGTH or not value.isprintable():
            return None
        return value


def same_token(given: str | None, session: Session) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given.encode(),
                                                          session.csrf.encode())

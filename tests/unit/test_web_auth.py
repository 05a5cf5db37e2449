"""The console's passwords and sessions, without a server: what is believed and what not."""

from __future__ import annotations

import time

from supervisor.config import WebAuthConfig
from supervisor.web.passwords import check_password, hash_password, hash_problem
from supervisor.web.sessions import Session, Sessions, same_token


def test_a_password_checks_against_its_hash_only():
    stored = hash_password("s3cret")
    assert hash_problem(stored) is None
    assert check_password("s3cret", stored)
    assert not check_password("s3cret ", stored) and not check_password("", stored)
    assert hash_password("s3cret") != stored  # a salt of its own each time


def test_a_session_cookie_is_believed_only_as_signed_and_while_current():
    sessions = Sessions(WebAuthConfig(users={"ops": hash_password("x")}))
    session = sessions.new("ops")
    cookie = sessions.cookie(session)
    loaded = sessions.load(cookie, "127.0.0.1", None)
    assert (loaded.user, loaded.csrf, loaded.fresh) == ("ops", session.csrf, False)
    body, _, signature = cookie.partition(".")
    forged = sessions.cookie(Session("root", "t", time.time() + 60)).split(".")[0]
    assert sessions.load(f"{forged}.{signature}", None, None).user is None
    assert Sessions(sessions.auth).load(cookie, None, None).user is None  # another key
    expired = sessions.cookie(Session("ops", "t", time.time() - 1))
    assert sessions.load(expired, None, None).fresh
    gone = Sessions(WebAuthConfig(users={}), key=sessions._key)
    assert gone.load(cookie, None, None).user is None  # removed from the config since
    assert same_token(session.csrf, loaded) and not same_token("other", loaded)
    assert not same_token(None, loaded)


def test_a_proxy_header_is_believed_only_from_a_trusted_address():
    sessions = Sessions(WebAuthConfig(proxy_header="x-forwarded-user",
                                      trusted_proxies=("127.0.0.1",)))
    assert sessions.load(None, "127.0.0.1", "alice").user == "alice"
    assert sessions.load(None, "10.1.2.3", "alice").user is None
    assert sessions.load(None, "127.0.0.1", "bad\nname").user is None
    assert sessions.load(None, "127.0.0.1", None).user is None

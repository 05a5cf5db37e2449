"""DSNs as they may be printed: without their passwords, in any spelling.

A password reaches the screen three ways: in the DSN printed whole (check-config, the start
log line); in libpq's error text, which quotes the piece of a DSN it cannot read; and, when a
URI's password holds an unencoded '/' or '@', in the host, port or database name that libpq
reads out of it. So the password is taken to run as far as it might (a URI's to the last '@';
an unreadable DSN's to the end), and a message about a DSN that libpq reads otherwise than it
is written shows nothing libpq quoted. When in doubt, more is hidden: a '@' in a URI's query
or database name hides the text before it too.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict

HIDDEN = "***"
EMBEDDED = "(embedded)"
# What libpq's isspace() ends an unquoted value with; Python's \s also takes U+00A0 and more.
_SPACE = " \t\n\v\f\r"
_URI = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://")
_QUERY_PASSWORD = re.compile(r"[?&]password=([^&]*)", re.IGNORECASE)
_PASSWORD_WORD = re.compile(r"password\s*=?", re.IGNORECASE)
# From the first quote to the last: a password may itself hold quotes of either kind.
_QUOTED = re.compile(r"[\"'].*[\"']", re.DOTALL)
MISREAD_HINT = ("; if the password holds '@' or '/', write them as %40 and %2F (libpq's "
                "reading of this URI is not shown: it may hold a part of the password)")


def redact_dsn(dsn: str | None) -> str:
    """The DSN with every password replaced by ``***``, safe to log or print."""
    if not dsn:
        return EMBEDDED
    return _replace_spans(dsn, password_spans(dsn))


def password_spans(dsn: str) -> list[tuple[int, int]]:
    """Where the DSN's passwords are written, as (start, end) offsets."""
    readable = libpq_reads(dsn)
    spans = _uri_spans(dsn, readable) if _URI.match(dsn) else _kv_spans(dsn, readable)
    word = _PASSWORD_WORD.search(dsn)
    if not spans and not readable and word:
        # libpq cannot read the DSN and its password was not found where it should be (an
        # earlier quote never closed): everything after the word is hidden.
        spans = [(word.end(), len(dsn))]
    return spans


def _uri_spans(dsn: str, readable: bool) -> list[tuple[int, int]]:
    user_info = _user_info_password(dsn)
    spans = [user_info] if user_info else []
    for match in _QUERY_PASSWORD.finditer(dsn):
        # Unreadable, a parameter's value may have gone on past an unencoded '&'.
        spans.append((match.start(1), match.end(1) if readable else len(dsn)))
    return spans


def _user_info_password(dsn: str) -> tuple[int, int] | None:
    """Where a URI's ``user:password@`` holds the password. libpq ends it at the first '@'
    or '/'; a password typed with either in it runs on to a later '@', so the last is taken.
    A user name holds neither ':' nor '@', so the colon comes before the first '@'."""
    start = _URI.match(dsn).end()
    first_at, last_at = dsn.find("@", start), dsn.rfind("@")
    colon = dsn.find(":", start, first_at) if first_at != -1 else -1
    return (colon + 1, last_at) if colon != -1 else None


def _kv_spans(dsn: str, readable: bool) -> list[tuple[int, int]]:
    """Password values of a key=value DSN, read the way libpq's conninfo_parse reads them.

    If libpq cannot read the DSN, it is not what its author meant (``password=two words``),
    and a password runs to the end.
    """
    spans, i = [], 0
    while i < len(dsn):
        i = key_start = _skip_space(dsn, i)
        while i < len(dsn) and dsn[i] not in _SPACE and dsn[i] != "=":
            i += 1
        key = dsn[key_start:i]
        i = _skip_space(dsn, i)
        if i >= len(dsn) or dsn[i] != "=":
            continue  # a word without a value: libpq refuses it; look on for passwords
        i = _skip_space(dsn, i + 1)
        end = _kv_value_end(dsn, i)
        if key.lower() == "password":
            spans.append((i, end if readable else len(dsn)))
        i = end
    return spans


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in _SPACE:
        i += 1
    return i


def _kv_value_end(dsn: str, i: int) -> int:
    """Where a value that starts at ``i`` ends: a quoted one after its closing quote (or at
    the end, unclosed), an unquoted one at white space; a backslash escapes the next
    character either way."""
    quoted = i < len(dsn) and dsn[i] == "'"
    i += quoted
    while i < len(dsn):
        if dsn[i] == "\\":
            i += 2
        elif quoted and dsn[i] == "'":
            return i + 1
        elif not quoted and dsn[i] in _SPACE:
            return i
        else:
            i += 1
    return len(dsn)


def _replace_spans(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with each span (overlapping ones merged) replaced by ``***``."""
    pieces, position = [], 0
    for start, end in sorted(spans):
        if end <= position:
            continue
        pieces.append(text[position:max(start, position)] + HIDDEN)
        position = end
    return "".join(pieces) + text[position:]


def libpq_reads(dsn: str) -> bool:
    try:
        conninfo_to_dict(dsn)
    except (psycopg.Error, ValueError):  # ValueError: text that cannot be encoded
        return False
    return True


def misread_uri(dsn: str) -> bool:
    """True when libpq reads a URI's password otherwise than it is written (up to the last
    '@'): then the host, port or database libpq reads may be pieces of the password."""
    if not _URI.match(dsn) or not libpq_reads(dsn):
        return False
    span = _user_info_password(dsn)
    if span is None:
        return False
    written = {unquote(dsn[span[0]:span[1]])}
    written |= {unquote(m[1]) for m in _QUERY_PASSWORD.finditer(dsn)}
    return conninfo_to_dict(dsn).get("password") not in written


def doubtful(dsn: str) -> bool:
    """libpq cannot read the DSN, or reads its password otherwise than it is written."""
    return not libpq_reads(dsn) or misread_uri(dsn)


def dsn_problem(dsn: str) -> str | None:
    """Why libpq cannot read the DSN, quoting no part of its password; None if it can."""
    if "\x00" in dsn:  # libpq would silently read only the text before it
        return "holds a NUL character"
    try:
        dsn.encode("utf-8")
    except UnicodeEncodeError as exc:  # a non-UTF-8 byte of the environment, say
        return f"holds a byte that is not UTF-8 at character {exc.start + 1}"
    try:
        conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"not a valid connection string: {hide_secrets(reason, dsn)}"
    return None


def secrets_in(dsn: str) -> list[str]:
    """Every spelling of the DSN's passwords that a message could quote, longest first."""
    found = [dsn[start:end] for start, end in password_spans(dsn)]
    found += [unquote(secret) for secret in found]
    found += [re.sub(r"\\(.)", r"\1", secret.strip("'"), flags=re.DOTALL) for secret in found]
    if libpq_reads(dsn):
        found.append(conninfo_to_dict(dsn).get("password") or "")
    # Longest first, so that a password holding another candidate is replaced whole.
    return sorted({secret for secret in found if secret}, key=len, reverse=True)


def hide_secrets(text: str, dsn: str) -> str:
    """``text`` (a message about ``dsn``) with nothing of the DSN's passwords left in it."""
    if doubtful(dsn) and password_spans(dsn):
        # libpq quotes the pieces it read or could not read, and any may be the password's.
        text = _QUOTED.sub(f'"{HIDDEN}"', text)
    for secret in secrets_in(dsn):
        text = text.replace(secret, HIDDEN)
    return text

"""DSNs that carry a password in every shape an operator might write one, for the tests that
check no part of it is ever printed.

Each password is made of distinct tokens that start with ``SECRET_STEM``, joined by the
characters that break naive redaction ('/', '@', quotes, spaces, percent signs ...). A text
that holds the stem has printed a part of the password.
"""

from __future__ import annotations

from urllib.parse import quote

from hypothesis import strategies as st

SECRET_STEM = "S3KRIT"
SEPARATORS = ["/", "@", ":", "?", "&", "=", "#", "%", "%2F", "%40", "%zz", "%00", "'", '"',
              "\\", " ", "\t", ",", ";", "é", "\u00a0", "$"]
# Where every connection goes: libpq reads host names and ports out of a misread password,
# so the environment pins the address (no DNS lookup) and the default port (closed).
PINNED_ENV = ("PGHOSTADDR", "PGPORT")


@st.composite
def passwords(draw) -> str:
    joins = st.lists(st.sampled_from(SEPARATORS), max_size=3).map("".join)
    count = draw(st.integers(1, 3))
    text = draw(joins)
    for index in range(count):
        text += f"{SECRET_STEM}{index}" + draw(joins)
    return text


def _kv_quoted(password: str) -> str:
    return "'" + password.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _kv_escaped(password: str) -> str:
    # libpq reads a backslash in an unquoted value as "take the next character as is".
    return "".join("\\" + ch if ch in " \t\n\v\f\r'\\" else ch for ch in password)


def dsn_shapes(password: str, port: int) -> dict[str, str]:
    """The password in each shape, for a server at 127.0.0.1:port."""
    encoded = quote(password, safe="")
    where = f"127.0.0.1:{port}/db"
    return {
        "uri, as typed": f"postgresql://app:{password}@{where}",
        "uri, percent-encoded": f"postgresql://app:{encoded}@{where}",
        "uri query, percent-encoded": f"postgresql://app@{where}?password={encoded}&sslmode=allow",
        "uri query, as typed": f"postgres://app@{where}?sslmode=allow&password={password}",
        "key=value, quoted": f"host=127.0.0.1 port={port} user=app password={_kv_quoted(password)}"
                             f" dbname=db",
        "key=value, escaped": f"host=127.0.0.1 port={port} password = {_kv_escaped(password)}"
                              f"\tdbname=db",
        "key=value, as typed": f"host=127.0.0.1 port={port} password={password} dbname=db",
    }


# Shapes libpq reads as the operator meant them: redacting these must keep the rest visible.
WELL_FORMED = ("uri, percent-encoded", "uri query, percent-encoded", "key=value, quoted",
               "key=value, escaped")

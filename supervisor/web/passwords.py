"""Password hashes for ``web.auth.users``: scrypt from the standard library (RFC 7914), in
one line of text, ``scrypt$N$r$p$salt$hash`` (salt and hash in base64), made by
``pgtaskd web hash-password``. No other module of the console sees a password."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re

# 16 MiB of memory and about 50 ms of CPU a check on the development machine: costly for a
# guesser, cheap for a login.
SCRYPT_N = 2 ** 14
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
_FORMAT = re.compile(r"^scrypt\$(\d{1,8})\$(\d{1,3})\$(\d{1,3})\$([A-Za-z0-9+/=]{8,200})"
                     r"\$([A-Za-z0-9+/=]{16,200})$")
# What a config may ask of a check: past this a login would take seconds and a flood of
# them the console's memory.
MAX_N = 2 ** 20
MAX_MEMORY = 256 * 1024 * 1024


def hash_password(password: str) -> str:
    salt = os.urandom(SALT_BYTES)
    digest = _scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P, HASH_BYTES)
    return "$".join(["scrypt", str(SCRYPT_N), str(SCRYPT_R), str(SCRYPT_P),
                     base64.b64encode(salt).decode(), base64.b64encode(digest).decode()])


def hash_problem(text: object) -> str | None:
    """Why ``text`` is not a hash this module can check, or None."""
    if not isinstance(text, str):
        return "must be a password hash (a string)"
    match = _FORMAT.match(text)
    if not match:
        return ("is not a password hash made by 'pgtaskd web hash-password' "
                "(scrypt$N$r$p$salt$hash)")
    n, r, p = int(match[1]), int(match[2]), int(match[3])
    if n < 2 or n & (n - 1) or n > MAX_N or not 1 <= r <= 64 or not 1 <= p <= 16 \
            or 128 * n * r > MAX_MEMORY:
        return f"has scrypt parameters out of bounds (N a power of 2 up to {MAX_N}, r 1-64, " \
               f"p 1-16, at most {MAX_MEMORY // 2 ** 20} MiB)"
    try:
        base64.b64decode(match[4], validate=True)
        base64.b64decode(match[5], validate=True)
    except binascii.Error:
        return "has a salt or hash that is not base64"
    return None


def check_password(password: str, stored: str) -> bool:
    """Whether ``password`` is the one ``stored`` (a hash that passed hash_problem) was
    made from; constant time in the comparison."""
    match = _FORMAT.match(stored)
    if not match or len(password) > 1024:
        return False
    n, r, p = int(match[1]), int(match[2]), int(match[3])
    expected = base64.b64decode(match[5])
    digest = _scrypt(password, base64.b64decode(match[4]), n, r, p, len(expected))
    return hmac.compare_digest(digest, expected)


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, length: int) -> bytes:
    return hashlib.scrypt(password.encode("utf-8", "surrogatepass"), salt=salt, n=n, r=r, p=p,
                          maxmem=MAX_MEMORY + 1024 * 1024, dklen=length)

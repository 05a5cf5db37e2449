"""The ``web:`` section: how ``pgtaskd web`` listens, who may log in, whether they may act.

Refused here, at load: a password that is not a hash (the file would hold a password in
clear), a proxy header that is not a header name, actions that no one could take (no
authentication). A bind beyond loopback without authentication is refused by ``pgtaskd
web`` when it starts (the daemons read the same file and have no business refusing it);
``check-config`` warns of it.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Mapping

from ..errors import quote
from ..web.passwords import hash_problem
from .defaults import (DEFAULT_WEB_DB_CONNECTIONS, DEFAULT_WEB_LISTEN,
                       DEFAULT_WEB_MAX_CONNECTIONS, DEFAULT_WEB_REFRESH_INTERVAL,
                       DEFAULT_WEB_REQUEST_TIMEOUT, MAX_METRICS_CONNECTIONS,
                       MAX_WEB_DB_CONNECTIONS, MIN_TIMEOUT, MIN_WEB_REFRESH_INTERVAL)
from .model import WebAuthConfig, WebConfig
from .validator import Validator, shown_key, type_name

# RFC 9110's token, the characters of a header's name.
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}$")
_USER_NAME = re.compile(r"^[^\s:]{1,100}$")


def parse_web(v: Validator, tree: Mapping) -> WebConfig:
    from .loader import parse_listen  # the metrics endpoint's rule, one module up

    section = v.section(tree, "web", "", {"listen", "actions", "auth", "max_connections",
                                          "request_timeout", "refresh_interval",
                                          "db_connections"})
    listen = parse_listen(v, v.string(section, "listen", "web", DEFAULT_WEB_LISTEN) or "",
                          key="web.listen", default=DEFAULT_WEB_LISTEN) or DEFAULT_WEB_LISTEN
    auth = _parse_auth(v, section)
    actions = v.boolean(section, "actions", "web", False)
    if actions and not auth.enabled:
        v.problem("web.actions", "true needs web.auth (users or proxy_header): actions are "
                                 "only for an authenticated user")
    return WebConfig(
        listen=listen, actions=actions, auth=auth,
        max_connections=v.integer(section, "max_connections", "web",
                                  DEFAULT_WEB_MAX_CONNECTIONS, minimum=1,
                                  maximum=MAX_METRICS_CONNECTIONS),
        request_timeout=v.number(section, "request_timeout", "web",
                                 DEFAULT_WEB_REQUEST_TIMEOUT, maximum=300,
                                 minimum=MIN_TIMEOUT, strict=False),
        refresh_interval=v.number(section, "refresh_interval", "web",
                                  DEFAULT_WEB_REFRESH_INTERVAL, maximum=3600,
                                  minimum=MIN_WEB_REFRESH_INTERVAL, strict=False),
        db_connections=v.integer(section, "db_connections", "web", DEFAULT_WEB_DB_CONNECTIONS,
                                 minimum=1, maximum=MAX_WEB_DB_CONNECTIONS),
    )


def _parse_auth(v: Validator, section: Mapping) -> WebAuthConfig:
    auth = v.section(section, "auth", "web", {"users", "proxy_header", "trusted_proxies"})
    users = {}
    raw_users = auth.get("users")
    if raw_users is not None and not isinstance(raw_users, dict):
        v.problem("web.auth.users", f"must be a mapping of user name to password hash, got "
                                    f"{type_name(raw_users)}")
    for name, stored in (raw_users or {}).items() if isinstance(raw_users, dict) else ():
        where = f"web.auth.users.{shown_key(name)}"
        if not isinstance(name, str) or not _USER_NAME.match(name):
            v.problem(where, "a user name must be 1 to 100 characters, no spaces nor colons")
            continue
        problem = hash_problem(stored)
        if problem:
            v.problem(where, problem)
        else:
            users[name] = stored
    header = v.string(auth, "proxy_header", "web.auth", None)
    if header is not None and not _HEADER_NAME.match(header):
        v.problem("web.auth.proxy_header", f"must be an HTTP header name (like "
                                           f"X-Forwarded-User), got {quote(header)}")
        header = None
    trusted = auth.get("trusted_proxies", ["127.0.0.1", "::1"])
    proxies = []
    if not isinstance(trusted, list):
        v.problem("web.auth.trusted_proxies", f"must be a list of IP addresses, got "
                                              f"{type_name(trusted)}")
        trusted = []
    for address in trusted:
        try:
            proxies.append(str(ipaddress.ip_address(address)))
        except ValueError:
            v.problem("web.auth.trusted_proxies", f"must hold IP addresses, got {quote(address)}")
    return WebAuthConfig(users=users, proxy_header=header.lower() if header else None,
                         trusted_proxies=tuple(proxies))

"""The password of a Redis that requires one, handed to pods in their environment and put into the Redis
URL when the cluster config is read (kvferry/cluster_config.py): Secrets stay out of the ConfigMap."""

from __future__ import annotations

from urllib.parse import quote, urlsplit, urlunsplit

REDIS_PASSWORD_ENV = "KVFERRY_REDIS_PASSWORD"


def with_password(url: str, password: str) -> str:
    """`url` with `password` as its credentials (a password the URL already has is kept)."""
    parts = urlsplit(url)
    if parts.password is not None or not parts.hostname:
        return url
    user = quote(parts.username, safe="") if parts.username else ""
    netloc = f"{user}:{quote(password, safe='')}@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit(parts._replace(netloc=netloc))

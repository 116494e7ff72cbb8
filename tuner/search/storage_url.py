"""Storage URLs may hold credentials: show them with every password hidden, in files, logs and errors; name the
database driver a URL is opened with, and the file a SQLite URL opens."""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["StorageError", "display_url", "engine_url", "hide_secret", "sqlite_file"]


class StorageError(ValueError):
    """A storage URL that cannot be opened here (its database driver is missing, the server refuses): one line,
    password hidden."""


_POSTGRES_PLAIN = "postgresql://"
_POSTGRES_HINT = "pip install 'cgtune[postgres]' (psycopg2-binary) and write postgresql:// or postgresql+psycopg2://"


def engine_url(url: str) -> str:
    """The URL to open: a `postgresql://` URL without a driver gets psycopg2's (`postgresql+psycopg2://`), the
    driver the `postgres` extra installs, since SQLAlchemy's own default changed to psycopg 3 in 2.1; StorageError
    when the URL's driver is not installed."""
    if url.startswith(_POSTGRES_PLAIN) and importlib.util.find_spec("psycopg2") is not None:
        url = "postgresql+psycopg2://" + url[len(_POSTGRES_PLAIN):]
    try:
        from sqlalchemy.engine import make_url

        u = make_url(url)
        dialect = u.get_dialect()
    except Exception:  # not a URL SQLAlchemy knows: optuna reports it as it does
        return url
    load = getattr(dialect, "import_dbapi", None) or dialect.dbapi  # SQLAlchemy 2.x, 1.4
    try:
        load()
    except ImportError as exc:
        missing = getattr(exc, "name", None) or str(exc)
        hint = _POSTGRES_HINT if u.get_backend_name() == "postgresql" else f"install the {u.get_driver_name()} driver"
        raise StorageError(f"storage {display_url(url)}: its database driver ({u.get_driver_name()}, module "
                           f"{missing!r}) is not installed: {hint}") from None
    return url

_SECRET_QUERY_KEYS = ("password", "passwd", "pwd", "sslpassword", "token", "secret")
"""Query parameters of a storage URL that hold secrets (libpq takes `?password=` as well as `user:password@`)."""


def display_url(url: str) -> str:
    """A storage URL fit for files and logs: any password, in the user part or the query, replaced by ***."""
    if not url or ("@" not in url and "?" not in url):
        return url
    try:
        from sqlalchemy.engine import make_url

        u = make_url(url)
        shown = u.render_as_string(hide_password=True)
        if any(k.lower() in _SECRET_QUERY_KEYS for k in u.query):
            base = u.set(query={}).render_as_string(hide_password=True)
            parts = [f"{k}={'***' if k.lower() in _SECRET_QUERY_KEYS else v}" for k, v in u.query.items()]
            shown = base + "?" + "&".join(parts)
        return shown
    except Exception:  # not an SQLAlchemy URL: keep only what follows the credentials, drop any query
        rest = url.rsplit("@", 1)[1] if "@" in url else url.split("://", 1)[-1]
        return "***@" + rest.split("?", 1)[0]


def hide_secret(text: str, url: str | None) -> str:
    """`text` with the URL shown as `display_url` shows it and its password nowhere, e.g. in a driver's error."""
    if not url:
        return text
    text = text.replace(url, display_url(url))
    secrets: list[str] = []
    try:
        from sqlalchemy.engine import make_url

        u = make_url(url)
        secrets.append(str(u.password or ""))
        for k, v in u.query.items():
            if k.lower() in _SECRET_QUERY_KEYS:
                secrets += [v] if isinstance(v, str) else list(v)
    except Exception:  # not an SQLAlchemy URL: mask what sits between the user and the host
        userinfo = url.split("://", 1)[-1].rsplit("@", 1)[0] if "@" in url else ""
        secrets.append(userinfo.split(":", 1)[1] if ":" in userinfo else "")
    for secret in sorted(filter(None, secrets), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def sqlite_file(url: str) -> Path | None:
    """The database file a `sqlite://` URL opens (SQLite creates it on open), None for another database or an
    in-memory one."""
    try:
        from sqlalchemy.engine import make_url

        u = make_url(url)
    except Exception:  # not a URL SQLAlchemy knows: nothing to say about its file
        return None
    if u.get_backend_name() != "sqlite" or u.database in (None, "", ":memory:"):
        return None
    return Path(u.database)

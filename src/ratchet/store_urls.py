"""Where a store is, as the CLI, `RATCHET_STORE` and `ratchet.connect` take it.

A store is named by URL (`sqlite:///runs.db`, `dynamodb://TABLE?...`,
`postgresql://USER@HOST/DATABASE`), or, for a local store,
by its plain file path: `runs.db` and `/srv/ratchet/runs.db` mean `sqlite:///runs.db` and
`sqlite:////srv/ratchet/runs.db`. Nothing here loads more than the standard library's
string methods: the quick read commands (`ratchet.cli.quick`) use it too.
"""

SQLITE_SCHEME = "sqlite:///"
DYNAMODB_SCHEME = "dynamodb://"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
"""A Postgres store's URL, in either of libpq's spellings (docs/postgres.md)."""
POSTGRES_FORM = "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
"""A Postgres store's URL as a refusal of another names it (the adapter takes libpq's
parameters after it too)."""
DEFAULT_STORE = "sqlite:///.ratchet/ratchet.db"


def store_url(store: str) -> str:
    """`store` as a URL: a value with no scheme (no `://`) is the path of a SQLite file; any
    other value is returned as it is, for the runtime to take or refuse."""
    if "://" in store or not store.strip():
        return store
    return SQLITE_SCHEME + store


def sqlite_file(store: str) -> str | None:
    """The path of the file a SQLite store URL names (`sqlite:///runs.db`: `runs.db`); None
    for a store of another kind, or a URL that names no file."""
    if not store.startswith(SQLITE_SCHEME) or not store[len(SQLITE_SCHEME) :].strip():
        return None
    return store[len(SQLITE_SCHEME) :]


HIDDEN = "***"
"""What a printed store URL shows in place of a password."""


def shown_url(url: str) -> str:
    """`url` as it may be printed or logged: a password in it (`postgresql://user:PASSWORD@host`,
    or libpq's `?password=...`) is shown as `***`, everything else as given. A URL is said in
    lines a person reads and copies, and ends up in terminals' scrollback and services' logs,
    which are no place for the database's password."""
    scheme, sep, rest = url.partition("://")
    if not sep or url.startswith(SQLITE_SCHEME):  # a file's path, whatever it holds
        return url
    # The user and password end at the last `@` before the query: a password may hold a `/`
    # its writer did not escape, which would otherwise end the host part before it.
    end = min((i for i in (rest.find(c) for c in "?#") if i >= 0), default=len(rest))
    userinfo, at, _ = rest[:end].rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.partition(':')[0]}:{HIDDEN}{rest[len(userinfo) :]}"
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    path, question, query = tail.partition("?")
    if question:
        query, hash_sign, fragment = query.partition("#")
        pairs = [
            f"{name}={HIDDEN}" if name.lower() == "password" else pair
            for pair in query.split("&")
            for name in [pair.partition("=")[0]]
        ]
        tail = f"{path}?{'&'.join(pairs)}{hash_sign}{fragment}"
    return f"{scheme}://{authority}{tail}"

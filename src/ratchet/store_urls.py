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

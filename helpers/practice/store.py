r"""The practice store: card states and the full review log in one SQLite file (standard ``sqlite3``).

Where it lives (:func:`store_path`): the path in the environment variable ``ATTN_PRACTICE_STORE``
if set, else ``practice.sqlite3`` in the user's data folder (``platformdirs.user_data_dir
("attention-notebooks")``, e.g. ``~/.local/share/attention-notebooks`` on Linux).

Tables: ``meta`` (``schema_version``), ``cards`` (one FSRS ``Card`` per deck card, as its JSON),
``reviews`` (every attempt: card, time, rating, passed, diagnosis, and FSRS's ``ReviewLog`` JSON, so
the schedule can be recomputed and the scheduler's parameters fitted to the learner's history) and
``hints``. Every write is one ``BEGIN IMMEDIATE`` transaction, so two processes writing at once
queue rather than lose an update. A file written by a newer schema, or one that is not a practice
store (another database, a corrupt file), gets a :class:`StoreError` and is never written to.

**The tests never reach the real store.** With ``ATTN_PRACTICE_TESTING`` set (the repository's
``conftest.py`` sets it for every pytest and nbval run, together with an ``ATTN_PRACTICE_STORE``
in a temporary folder), :func:`store_path` refuses to fall back to the user data folder.
"""
from __future__ import annotations

import os
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from .deck import PracticeError

__all__ = ["SCHEMA_VERSION", "StoreError", "Store", "store_path"]

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cards (card TEXT PRIMARY KEY, fsrs TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS reviews (
    id INTEGER PRIMARY KEY AUTOINCREMENT, card TEXT NOT NULL, reviewed_at TEXT NOT NULL,
    rating INTEGER NOT NULL, passed INTEGER NOT NULL, diagnosis TEXT, review_log TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS hints (id INTEGER PRIMARY KEY AUTOINCREMENT, card TEXT NOT NULL, at TEXT NOT NULL);
"""
_TABLES = {"meta", "cards", "reviews", "hints"}


class StoreError(PracticeError):
    """The store file cannot be used; it has been left exactly as it was."""


def store_path() -> Path:
    """``$ATTN_PRACTICE_STORE``, else ``practice.sqlite3`` in the user data folder.

    Raises:
        StoreError: under the tests (``ATTN_PRACTICE_TESTING`` set) without ``ATTN_PRACTICE_STORE``.
    """
    env = os.environ.get("ATTN_PRACTICE_STORE")
    if env:
        return Path(env).expanduser()
    if os.environ.get("ATTN_PRACTICE_TESTING"):
        raise StoreError("the practice store: ATTN_PRACTICE_TESTING is set (a test run) and ATTN_PRACTICE_STORE is "
                         "not, so there is no store to open (rule: under the tests the real store in the user data "
                         "folder is never used; pass a store under tmp_path or set ATTN_PRACTICE_STORE)")
    import platformdirs

    return Path(platformdirs.user_data_dir("attention-notebooks", appauthor=False)) / "practice.sqlite3"


class Store:
    """An open practice store (see the module docstring). ``Store(path)`` creates it if absent."""

    def __init__(self, path: Optional[os.PathLike | str] = None, timeout: float = 30.0,
                 source: Optional[str] = None) -> None:
        """``source`` names where ``path`` came from (e.g. ``"--store"``), for the error messages."""
        if path is None:
            self.path = store_path()
            source = source or ("ATTN_PRACTICE_STORE" if os.environ.get("ATTN_PRACTICE_STORE") else "the user data folder")
        else:
            self.path = Path(path).expanduser()
        self._source = source
        self._timeout = timeout
        fresh = not self.path.exists() or self.path.stat().st_size == 0 or self._check_existing() == "empty"
        if fresh:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.transaction() as db:
                for stmt in filter(str.strip, _SCHEMA.split(";")):
                    db.execute(stmt)
                db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            self._check_existing()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None)
        db.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
        return db

    def _check_existing(self) -> Optional[str]:
        """Raise :class:`StoreError` unless the file is a store of this schema; ``"empty"`` for a database
        without any table (a store another process is creating right now, or a blank file)."""
        where = f"{self.path}" + (f" (from {self._source})" if self._source else "")
        other = {"--store": "pass another --store", "ATTN_PRACTICE_STORE": "point ATTN_PRACTICE_STORE at another file",
                 "the user data folder": "set ATTN_PRACTICE_STORE to another file"}.get(self._source, "open another file")
        rule = f"it was left untouched; move it away, or {other}"
        with open(self.path, "rb") as f:
            header = f.read(16)
        if header != b"SQLite format 3\x00":
            raise StoreError(f"practice store {where} is not an SQLite database (corrupt, or another file): {rule}")
        try:
            # A file URI (percent-encoded: a '?' or '#' in the path stays part of the path), opened read-only.
            db = sqlite3.connect(f"{self.path.absolute().as_uri()}?mode=ro", uri=True, timeout=self._timeout)
            try:
                tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if not tables:
                    return "empty"
                if "meta" not in tables:
                    raise StoreError(f"practice store {where} is an SQLite database but not a practice store "
                                     f"(no meta table): {rule}")
                row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                    raise StoreError(f"practice store {where} is corrupt (sqlite quick_check failed): {rule}")
            finally:
                db.close()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"practice store {where} cannot be read ({e}): corrupt? {rule}") from None
        version = int(row[0]) if row else -1
        if version > SCHEMA_VERSION:
            raise StoreError(f"practice store {where} has schema version {version}, newer than this code's "
                             f"{SCHEMA_VERSION} (written by a newer attention-notebooks): update the code; {rule}")
        if version != SCHEMA_VERSION or not _TABLES <= tables:
            raise StoreError(f"practice store {where} has schema version {version} and tables {sorted(tables)}, "
                             f"expected version {SCHEMA_VERSION} with {sorted(_TABLES)}: {rule}")
        return None

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``): committed on success, rolled back on error."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    def read(self, sql: str, args: tuple = ()) -> list[tuple]:
        db = self._connect()
        try:
            return db.execute(sql, args).fetchall()
        finally:
            db.close()

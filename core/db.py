"""Cursors for the few statements every API request runs, so that PostgreSQL can keep their plans.

Django's PostgreSQL backend binds parameters on the client (psycopg's ``ClientCursor``): each statement
reaches the server as new text, which it parses and plans every time — about a third of PostgreSQL's CPU
per quote (the token lookup, the job, the ten quote rows and the job's summary: issue 14). A cursor from
:func:`bound_cursor` lets PostgreSQL bind the parameters instead (psycopg's ``Cursor``), and psycopg
prepares a statement once a connection has run it ``prepare_threshold`` times (the database setting's
``OPTIONS``; production sets it with the built-in connection pool, whose connections live for the
process: config/settings/production.py). Without a threshold (tests, PgBouncer in transaction mode,
where a prepared statement would land on another server connection) the statements are still bound on
the server, only not prepared.

Only for statements written for it: placeholders where PostgreSQL can infer each parameter's type (a
comparison with a column, an explicit cast), never an ``IN %s`` of a tuple or a parameter in a SELECT
list; every other query keeps Django's cursor. The cursor is Django's wrapper (database errors mapped,
queries logged in debug and counted by tests) around psycopg's, on the same connection and transaction.
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.utils import CursorWrapper


def bound_cursor(alias: str = DEFAULT_DB_ALIAS) -> CursorWrapper:
    """A cursor of the database connection ``alias`` whose parameters PostgreSQL binds (Django's usual
    cursor on any other database or driver)."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return connection.cursor()
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        return connection.cursor()
    import psycopg

    connection.ensure_connection()
    with connection.wrap_database_errors:
        # What connection.cursor() does, around psycopg's server-binding cursor instead of the backend's
        # client-binding one (create_cursor); _prepare_cursor picks the debug wrapper when queries are
        # logged.
        return connection._prepare_cursor(psycopg.Cursor(connection.connection))  # type: ignore[attr-defined]

"""Alembic environment of the store: runs on the connection the Store hands it.

:class:`tula.service.store.Store` opens a transaction (SQLite: ``BEGIN IMMEDIATE``;
PostgreSQL: with a transaction-scoped advisory lock) and puts its connection in
``config.attributes["connection"]``, so the whole upgrade is one transaction that a second
process opening the same database waits for.  To write a new revision (a developer's task):
``alembic -c src/tula/service/migrations/alembic.ini revision -m "..."`` with the URL of a
scratch database, then edit it by hand.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from tula.core.errors import TulaError
from tula.service.store import VERSION_TABLE

config = context.config
connection = config.attributes.get("connection")


def _run(conn) -> None:
    context.configure(connection=conn, version_table=VERSION_TABLE, render_as_batch=True, transactional_ddl=True)
    with context.begin_transaction():
        context.run_migrations()


if connection is not None:
    _run(connection)
else:  # the alembic command line, on sqlalchemy.url from alembic.ini or -x url=...
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise TulaError(
            "the store's migrations need a database URL: set sqlalchemy.url in alembic.ini or pass -x url=..."
        )
    engine = create_engine(url)
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()

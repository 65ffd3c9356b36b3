"""Alembic migrations of the store's schema, run by :class:`tula.service.store.Store` on open."""

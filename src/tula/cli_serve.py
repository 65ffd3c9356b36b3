"""The service's bootstrap for ``tula serve``: the checks before it binds (its home, its store, its
port: one sentence each), then serving until Ctrl-C / SIGTERM, which stop it with exit 130 / 143.

:mod:`tula.cli` holds the verb and its options and calls these.
"""

from __future__ import annotations

from tula.cli_console import err_console
from tula.core.errors import Interrupted, TulaError
from tula.core.say import plain, say


def ready_to_serve(settings) -> None:
    """Check that the service can start with ``settings`` -- its home, its store, its port: one
    sentence each, before binding -- and say where it runs."""
    from tula.service.store import Store

    settings.check_can_start()
    settings.home.mkdir(parents=True, exist_ok=True)
    Store(settings.store_url, settings.home).close()  # a store that cannot be opened: one sentence, before binding
    check_can_listen(settings.host, settings.port)  # a port in use: one sentence, not uvicorn's log and exit 3
    shown = "localhost" if settings.loopback else settings.host
    say(
        err_console,
        f"Tula service on http://{shown}:{settings.port} (API docs at /docs), store "
        f"{settings.store_url if '@' not in settings.store_url else 'from --db-url'}, data in {settings.home}, "
        f"jobs run on {settings.cluster}",
    )


def serve_until_stopped(settings) -> None:
    """Serve the app until Ctrl-C / SIGTERM (then :class:`Interrupted`, exit 130 / 143); a
    server that could not start is one sentence."""
    import contextlib
    import signal

    import uvicorn

    from tula.service.app import create_app

    stopped_by: list[int] = []

    class _Server(uvicorn.Server):
        """Ctrl-C / SIGTERM: shut down (running jobs are queued again), then exit 130 / 143."""

        @contextlib.contextmanager
        def capture_signals(self):
            previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in previous.items():
                    signal.signal(s, h)

        def _on_signal(self, sig: int, frame) -> None:
            stopped_by.append(sig)
            if self.should_exit:  # a second signal: do not wait for open connections
                self.force_exit = True
            self.should_exit = True

    server = _Server(uvicorn.Config(create_app(settings), host=settings.host, port=settings.port, log_level="warning"))
    try:
        server.run()
    except SystemExit:  # uvicorn's exit when it cannot start (its reason logged above)
        if server.started:
            raise
        raise TulaError(
            f"the service could not start on {settings.host}:{settings.port}; the line above says why"
        ) from None
    if stopped_by:
        raise Interrupted(
            f"the service stopped on {signal.Signals(stopped_by[0]).name}; running jobs were queued "
            "again and resume when it starts",
            stopped_by[0],
        )
    if not server.started:
        raise TulaError(f"the service could not listen on {settings.host}:{settings.port} (is the port in use?)")


def check_can_listen(host: str, port: int) -> None:
    """One sentence when ``host:port`` cannot be bound (another process listens there, a port
    below 1024 without the right), before the service says it starts."""
    import errno
    import socket

    from tula.service.settings import SettingsError

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: a closed port is free
            s.bind(address)
    except OSError as err:
        why = err.strerror or plain(err)
        if err.errno == errno.EADDRINUSE:
            why += ": another process listens there; stop it or choose another --port"
        raise SettingsError(f"the service cannot listen on {host}:{port} ({why})") from None

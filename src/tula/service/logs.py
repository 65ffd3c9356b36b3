"""The service's log: where the ``tula.*`` loggers of the service process and of its runner
processes write.

The library logs through :mod:`logging` only (a logger per module, ``tula.<module>``) and
configures nothing.  The processes the service starts are applications, so they give the
``tula`` logger a handler: :func:`configure_logging` is called where ``tula serve``'s app
starts (its lifespan) and where a runner process starts (``python -m tula.service.runner``,
whose stderr is ``runners.log`` in the service's home).

``TULA_LOG_LEVEL`` (``DEBUG``, ``INFO``, ``WARNING``, ``ERROR``; default ``INFO``) sets the level.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

__all__ = ["configure_logging", "LOG_FORMAT", "LEVEL_ENV"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: the environment variable that sets the level of the tula loggers in the service's processes
LEVEL_ENV = "TULA_LOG_LEVEL"


def configure_logging(stream: Any = None, default: int = logging.INFO) -> logging.Logger:
    """Give the ``tula`` logger one handler writing to ``stream`` (default: stderr) at the level
    ``$TULA_LOG_LEVEL`` names (else ``default``), unless logging is configured already (a handler on
    the root logger -- the embedding application's, pytest's -- or on ``tula``): then nothing
    changes.  Calling it again changes nothing.  Returns the ``tula`` logger.

    Parameters
    ----------
    stream : file-like or None
        Where the lines go (default: ``sys.stderr`` at the time of the call).
    default : int
        The level when ``$TULA_LOG_LEVEL`` is not set: INFO for the service's processes; a
        command line that shows its own progress would pass WARNING.

    Returns
    -------
    logging.Logger
        The ``tula`` logger.
    """
    logger = logging.getLogger("tula")
    if logger.handlers or logging.getLogger().handlers:
        return logger
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.addHandler(handler)
    asked = os.environ.get(LEVEL_ENV, "").strip()
    level = logging.getLevelName(asked.upper()) if asked else default
    logger.setLevel(level if isinstance(level, int) else default)
    if not isinstance(level, int):
        logger.warning(
            "%s is %r, which is no level (DEBUG, INFO, WARNING, ERROR); logging at %s",
            LEVEL_ENV,
            asked,
            logging.getLevelName(default),
        )
    return logger

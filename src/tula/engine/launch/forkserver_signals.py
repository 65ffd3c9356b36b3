"""Imported by the local launcher's fork server, and only there (its preload list).

The fork server is the parent of every local rank, and a rank ends when its parent does
(``PR_SET_PDEATHSIG``).  A SIGTERM to the whole process group (``kill -TERM -PGID``,
``scancel``) must let the ranks stop cleanly at their next step, as the launching process
tells them to, so the fork server ignores SIGTERM (it already ignores SIGINT).  It still
ends when the launching process does, however that ends: it reads end-of-file on the pipe it
shares with it, and the ranks' death signal then takes any rank left.
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)

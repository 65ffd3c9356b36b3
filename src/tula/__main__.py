"""The ``tula`` command's entry point, and ``python -m tula`` (e.g. ``torchrun --nproc-per-node 2
-m tula train ...``).

It imports the command line inside :func:`main`, so that Ctrl-C while those imports run (about
0.6 s) is one sentence and exit 130, as everywhere else, not a traceback; and once the
command has ended, a signal during the interpreter's clean-up ends the process at once with
130 or 143 and a line, not as a KeyboardInterrupt in that clean-up's middle (the process then
died of SIGINT and said nothing).  ``tula.cli.main`` itself does neither, so that tests can
run it in their own process.
"""

from __future__ import annotations

import os
import signal
import sys


def main() -> None:
    try:
        from tula.cli import main as command
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: stopped by SIGINT while the command was starting; nothing was done\n")
        raise SystemExit(130) from None
    try:
        command()
    except SystemExit:
        _exit_at_once_on_a_signal()
        raise


def _exit_at_once_on_a_signal() -> None:
    def now(signum, frame) -> None:  # noqa: ARG001
        os.write(2, f"interrupted: stopped at once by {signal.Signals(signum).name} as the command ended\n".encode())
        os._exit(128 + signum)

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, now)


if __name__ == "__main__":
    main()

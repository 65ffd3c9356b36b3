"""The ``tula`` command's entry point, and ``python -m tula`` (e.g. ``torchrun --nproc-per-node 2
-m tula train ...``).

It imports the command line inside :func:`main`, so that Ctrl-C while those imports run (about
0.6 s) is one sentence and exit 130, as everywhere else, not a traceback; and once the
command has ended, a signal during the interpreter's clean-up ends the process at once with
130 or 143 and a line, not as a KeyboardInterrupt in that clean-up's middle (the process then
died of SIGINT and said nothing).  ``tula.cli.main`` itself does neither, so that tests can
run it in their own process.

What an inherited disposition means is decided here, once: Ctrl-C (SIGINT) and SIGTERM stop
the command at every moment, whatever the process that started it left them at.  A shell that
runs a command in the background starts it with SIGINT ignored; Python keeps an ignored SIGINT
ignored, so before this the command ignored Ctrl-C while it started (its imports, its fork
server's start) and answered it once it had set its own handlers a few seconds later -- two
meanings in one run.  To run Tula immune to a terminal's Ctrl-C, start it in a session of its
own (``setsid tula ...``), which no terminal signal reaches.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

#: set when a SIGINT reached the entry point's handler (the command may set handlers of its own later)
_sigint_seen = False


def main() -> None:
    _stop_signals_stop()
    try:
        from tula.cli import main as command
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: stopped by SIGINT while the command was starting; nothing was done\n")
        raise SystemExit(130) from None
    code: object = 0
    try:
        command()
    except SystemExit as done:
        code = done.code
    _exit_at_once_on_a_signal()
    if _sigint_seen and code in (0, None):
        # the KeyboardInterrupt was swallowed on its way (a library's callback: "Exception ignored
        # in ...", or a user's code that catches it) and the command went on to succeed: Ctrl-C is never success
        sys.stderr.write("interrupted: a SIGINT arrived while the command ran and was swallowed on its way; exit 130\n")
        code = 130
    raise SystemExit(code)


def _stop_signals_stop() -> None:
    """SIGINT raises KeyboardInterrupt -- and is remembered, so that a command it reached never
    ends in success -- and SIGTERM ends the process, from the first line on, even where the
    starting process left them ignored."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        global _sigint_seen
        _sigint_seen = True
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, interrupt)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _exit_at_once_on_a_signal() -> None:
    def now(signum, frame) -> None:  # noqa: ARG001
        os.write(2, f"interrupted: stopped at once by {signal.Signals(signum).name} as the command ended\n".encode())
        os._exit(128 + signum)

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, now)


if __name__ == "__main__":
    main()

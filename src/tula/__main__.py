"""The ``tula`` command's entry point, and ``python -m tula`` (e.g. ``torchrun --nproc-per-node 2
-m tula train ...``).

It imports the command line inside :func:`main`, so that Ctrl-C while those imports run (about
0.6 s) is one sentence and exit 130, as everywhere else, not a traceback.
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from tula.cli import main as command
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: stopped by SIGINT while the command was starting; nothing was done\n")
        raise SystemExit(130) from None
    command()


if __name__ == "__main__":
    main()

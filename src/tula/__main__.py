"""``python -m tula``: the ``tula`` command (e.g. ``torchrun --nproc-per-node 2 -m tula train ...``)."""

from tula.cli import main

main()

"""``python -m burstctl``: the same command line as the ``burstctl`` script."""

from burstctl.cli import main

main()

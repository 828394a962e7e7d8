"""`python -m omni_autoconf` runs the command line."""

from .cli.entry import run

run()

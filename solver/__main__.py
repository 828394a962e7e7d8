"""`python -m omni_autoconf` runs the command line."""

from .entry import run

run()

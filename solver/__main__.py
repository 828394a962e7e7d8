"""`python -m omni_autoconf` runs the command line."""

from .cli import main

main()

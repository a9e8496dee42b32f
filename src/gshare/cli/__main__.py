"""``python -m gshare.cli``."""

from gshare.cli import main

main()

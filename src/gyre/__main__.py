"""``python -m gyre`` is the ``gyre`` command."""

from gyre.cli import main

raise SystemExit(main())

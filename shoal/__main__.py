"""``python -m shoal``: same as the ``shoal`` console script."""

from shoal.cli import main

raise SystemExit(main())

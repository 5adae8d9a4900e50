"""``python -m interp``: the same as the ``interp`` console command."""

import sys

from interp.cli import main

sys.exit(main())

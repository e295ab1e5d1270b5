"""``python -m rebatch``: the ``rebatch`` command."""

import sys

from rebatch.cli import main

sys.exit(main())

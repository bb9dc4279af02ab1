"""``python -m dpkit``: the same as the ``dpkit`` command."""

import sys

from dpkit.cli import main

sys.exit(main())

"""The name the placement check is switched on by: ``python -m dpkit.placement_check IPYTHONDIR``
(writes a kernel config), ``%load_ext dpkit.placement_check``, and the ``dpkit`` command.

The check itself is test tooling and lives in :mod:`dpkit.testing.placement_check`; this
module holds its names.
"""

import sys

from dpkit.testing.placement_check import *  # noqa: F403 (the same names, under this one)
from dpkit.testing.placement_check import __all__ as __all__
from dpkit.testing.placement_check import write_kernel_config

if __name__ == "__main__":
    print(write_kernel_config(sys.argv[1]))

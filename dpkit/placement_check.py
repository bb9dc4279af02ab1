"""The name the placement check is switched on by: ``python -m dpkit.placement_check IPYTHONDIR``
(writes a kernel config), ``%load_ext dpkit.placement_check``, and the ``dpkit`` command.

The check itself is test tooling and lives in :mod:`dpkit.testing.placement_check`.
"""

import sys

from dpkit.testing.placement_check import (
    ENVIRONMENT_VARIABLE,
    active,
    checking_placement,
    disable,
    enable,
    enable_from_environment,
    load_ipython_extension,
    write_kernel_config,
)

__all__ = [
    "ENVIRONMENT_VARIABLE",
    "active",
    "checking_placement",
    "disable",
    "enable",
    "enable_from_environment",
    "load_ipython_extension",
    "write_kernel_config",
]

if __name__ == "__main__":
    print(write_kernel_config(sys.argv[1]))

"""What every benchmark writes beside its numbers: the machine and software they came from."""

import os
import platform
from typing import Any


def machine(**extra: Any) -> dict[str, Any]:
    """torch and Python versions, the platform, its cores and torch's intra-op threads (a
    timing depends on them all), then ``extra``: what one benchmark adds (a GPU's name, load).
    torch is imported here, not above: the mutation driver never needs it otherwise."""
    import torch

    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        **extra,
    }

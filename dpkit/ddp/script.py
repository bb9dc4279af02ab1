"""A training script's ``main`` run on N ranks the way ``torchrun`` runs the script, but
started from dpkit's preloaded fork server: in a second, not the seconds per rank that a
fresh interpreter importing torch costs (``torchrun`` starts one per rank).

Each rank gets what ``torchrun`` sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``) and calls ``main(argv)``; ``"{store}"`` in ``argv`` is
replaced by a ``file://`` URL for ``init_process_group(init_method=...)``, a file store in a
fresh private folder, so that nothing listens on the network. ``main`` must be importable
(see :mod:`dpkit.ddp.workload`). Errors, deaths and stalls are reported as for
:func:`dpkit.ddp.run_ddp`, naming the rank.

    from dpkit.ddp.script import run_main
    import ddp_recipe                      # examples/ddp_recipe.py, on sys.path
    run_main(ddp_recipe.main, ["--init-method", "{store}", "--out", "runs/4"], nproc=4)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from dpkit.ddp import checks, launch, process, workload


def script_rank(
    rank: int, where: process.Progress, messages: Any, go: Any, main: Callable[..., Any],
    argv: list[str], nproc: int, nodes: int,
) -> None:  # fmt: skip
    """The body of each rank: torchrun's variables, then ``main(argv)``."""
    per_node = nproc // nodes
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank % per_node), WORLD_SIZE=str(nproc),
        LOCAL_WORLD_SIZE=str(per_node), GROUP_RANK=str(rank // per_node),
    )  # fmt: skip
    loopback = checks.loopback_interface()
    if loopback is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
    where.at(process.CONNECTING)
    status = main(argv)
    where.at(process.FINISHED)
    messages.put(("done", rank, status))


def run_main(
    main: Callable[[Sequence[str]], Any],
    argv: Sequence[str],
    nproc: int,
    nodes: int = 1,
    timeout: float = 120.0,
) -> list[Any]:
    """``main(argv)`` on ``nproc`` ranks (``nodes`` "nodes" of ``nproc // nodes`` ranks, by
    the numbers torchrun gives them); what ``main`` returned, by rank. ``timeout``: seconds
    with no rank moving on (the whole run of a script, which reports no steps)."""
    nproc = checks.check_nproc(nproc)
    timeout = checks.check_timeout(timeout)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1 or nproc % nodes:
        raise ValueError(f"nodes must divide nproc={nproc} evenly, got {nodes!r}")
    try:  # the same rule as a workload's functions: the ranks import it by name
        workload.check_importable(workload.Workload(model=main))
    except ValueError as error:
        raise ValueError(str(error).replace("workload.model", "main", 1)) from None
    folder = tempfile.mkdtemp(prefix="dpkit-script-")
    store = "file://" + os.path.join(folder, "store")
    argv = [store if item == "{store}" else item for item in argv]
    try:
        with launch.Ranks(script_rank, (main, argv, nproc, nodes), nproc, timeout) as ranks:
            return ranks.wait_for("done")
    finally:
        shutil.rmtree(folder, ignore_errors=True)

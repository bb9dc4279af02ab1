"""Shared pytest setup: the placement check for tests marked ``placement_check``.

A test module with ``pytestmark = pytest.mark.placement_check`` runs with
:mod:`dpkit.testing.placement_check` on (CPU lanes apart from plain CPU memory, as lanes on a
GPU), so code that forgets to put a model or a target on the devices fails here as it would on
Colab.
The check is on for the whole module, module-scoped fixtures included.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dpkit.testing.placement_check import checking_placement


@pytest.fixture(autouse=True, scope="module")
def _placement_check_for_marked_modules(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("placement_check") is None:
        yield
        return
    with checking_placement():
        yield

"""Shared pytest setup: the placement check for tests marked ``placement_check``, and
``dpkit predict``'s models built once per test module.

A test module with ``pytestmark = pytest.mark.placement_check`` runs with
:mod:`dpkit.testing.placement_check` on (CPU lanes apart from plain CPU memory, as lanes on a
GPU), so code that forgets to put a model or a target on the devices fails here as it would on
Colab.
The check is on for the whole module, module-scoped fixtures included.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from dpkit.testing.placement_check import checking_placement


@pytest.fixture(autouse=True, scope="module")
def _placement_check_for_marked_modules(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("placement_check") is None:
        yield
        return
    with checking_placement():
        yield


@pytest.fixture(scope="module")
def _models_built() -> dict[tuple[str, int], tuple[torch.nn.Module, torch.Tensor]]:
    """(name, seed) -> the model build_model made and torch's random state right after it,
    kept for one test module (wide-mlp's weights alone are 97 MB)."""
    return {}


@pytest.fixture
def predict_models_built_once(
    monkeypatch: pytest.MonkeyPatch,
    _models_built: dict[tuple[str, int], tuple[torch.nn.Module, torch.Tensor]],
) -> None:
    """``dpkit predict`` (:mod:`dpkit.cost.cli`) in this process gets each seeded course
    model built once per test module, not once per command. cost.profile caches its counts
    on the model object, so a model is run and counted on its first command only: the
    profiling, most of a command's time, is done a few times instead of dozens. The model is
    the one build_model(name, seed) makes (predict only reads it: profile runs a copy), and
    torch's random state is set to where build_model leaves it, so what follows (the sample
    input) is drawn as in a fresh command."""
    from dpkit.cost import cli
    from dpkit.models import build_model

    def built_once(name: str, seed: int | None = None) -> torch.nn.Module:
        if seed is None:  # unseeded weights differ from call to call: build afresh
            return build_model(name)
        if (name, seed) not in _models_built:
            model = build_model(name, seed=seed)
            _models_built[name, seed] = model, torch.get_rng_state()
        model, state = _models_built[name, seed]
        torch.set_rng_state(state)
        return model

    monkeypatch.setattr(cli, "build_model", built_once)

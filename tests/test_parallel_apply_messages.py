"""parallel_apply's bad-input errors, word for word (issue 18): each names the argument and
the fix. Found missing by mutation testing (issue 20): a changed word survived every test."""

from __future__ import annotations

import re
import threading

import pytest
import torch
from lanes import lanes
from torch import nn

import dpkit

GENERATOR_FIX = "(a generator can be turned into one with list(...))"


def message(call) -> str:
    with pytest.raises((TypeError, ValueError)) as error:
        call()
    return str(error.value)


def test_devices_given_as_a_generator_are_named_even_without_kwargs():
    module, devices = nn.Identity(), lanes(2)
    assert message(
        lambda: dpkit.parallel_apply([module] * 2, [torch.ones(1)] * 2, None, iter(devices))
    ) == (
        "devices must be a list or tuple, got a list_iterator; pass one device per replica, "
        f"e.g. dpkit.devices(n), or None {GENERATOR_FIX}"
    )


def test_modules_without_an_order_are_refused():
    # A set has a length but no order: which replica would get which input?
    assert message(
        lambda: dpkit.parallel_apply({nn.Identity()}, [torch.ones(1)], devices=lanes(1))
    ) == (
        "modules must be a list or tuple, got a set; pass the replicas, e.g. "
        f"dpkit.replicate(model, devices) {GENERATOR_FIX}"
    )


@pytest.mark.parametrize(
    ("timeout", "shown"),
    [(10**400, "a number of 401 digits"), (1e300, "1e+300"), (10**10, "10000000000")],
)
def test_a_timeout_longer_than_a_thread_can_wait_is_refused_up_front(timeout, shown):
    """10**400 died in an OverflowError from math.isfinite, and 1e10 s in the thread's wait."""
    with pytest.raises(ValueError, match=f"at most 9223372036 .*, got {re.escape(shown)}; pass"):
        dpkit.parallel_apply([nn.Identity()], [torch.ones(1)], devices=lanes(1), timeout=timeout)


@pytest.mark.parametrize("timeout", [0, float("inf"), float("nan")])
def test_a_timeout_that_is_not_a_positive_finite_number_gets_both_ways_out(timeout):
    assert message(
        lambda: dpkit.parallel_apply(
            [nn.Identity()], [torch.ones(1)], devices=lanes(1), timeout=timeout
        )
    ) == (
        "timeout must be a positive number of seconds, at most 9223372036 (about 292 years, the "
        f"longest a thread can wait), got {timeout!r}; pass e.g. timeout=60, or timeout=None to "
        "wait as long as the replicas take"
    )


@pytest.mark.parametrize(
    ("timeout", "shown"),
    [(-(10**18), "-1000000000000000000"), (-(10**19), "a number of 21 digits")],
)
def test_a_timeout_is_shown_whole_up_to_20_characters(timeout, shown):
    """-10**18 is 20 characters and shown as written; -10**19, one more, by its digits."""
    with pytest.raises(ValueError, match=f"got {re.escape(shown)}; pass e.g. timeout=60"):
        dpkit.parallel_apply([nn.Identity()], [torch.ones(1)], devices=lanes(1), timeout=timeout)


def test_the_longest_wait_a_thread_allows_is_accepted():
    # threading refuses waits beyond TIMEOUT_MAX (OverflowError); TIMEOUT_MAX itself is fine
    out = dpkit.parallel_apply(
        [nn.Identity()], [torch.ones(1)], devices=lanes(1), timeout=threading.TIMEOUT_MAX
    )
    assert torch.equal(out[0], torch.ones(1))

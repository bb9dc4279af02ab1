"""Task 3's grad-mode and exception checks, judged by the parent (dpkit.grading.conduct) on
values written here by hand: each wrong answer gets the hint that names its fix."""

from __future__ import annotations

import torch

from dpkit.grading import conduct


def ints(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def test_a_replica_that_never_ran_is_named_before_its_grad_mode():
    never_ran = {"seen": ints(-1, 1), "requires_grad": ints(1, 1), "probe": ints(1)}
    assert "did not run every replica" in conduct.judge_carried([2, [True]], never_ran)
    assert "did not run the module" in conduct.judge_grad_mode([[True, True]], {"seen": ints(-1)})
    hint = conduct.judge_grad_mode([[False, True]], {"seen": ints(0)})
    assert "ran the module with grad disabled (the caller's mode was False)" in hint


def test_a_grad_mode_that_did_not_reach_the_replicas_names_the_missing_step():
    # The probe says whether the caller's mode reached the workers at all (0: it did not).
    disabled = {"seen": ints(0, 0), "requires_grad": ints(0, 0)}
    not_passed = conduct.judge_carried([2, [True]], {**disabled, "probe": ints(0)})
    assert "replicas ran with grad disabled with grad enabled" in not_passed
    assert "pass torch.is_grad_enabled() to the workers" in not_passed
    not_applied = conduct.judge_carried([2, [True]], {**disabled, "probe": ints(1)})
    assert "torch.set_grad_enabled(grad_enabled)" in not_applied
    assert "pass torch.is_grad_enabled()" not in not_applied
    enabled = {"seen": ints(1, 1), "requires_grad": ints(1, 1), "probe": ints(1)}
    under_no_grad = conduct.judge_carried([2, [False]], enabled)
    assert "replicas ran with grad enabled under torch.no_grad()" in under_no_grad
    right = {"seen": ints(0, 0, 1, 1), "requires_grad": ints(0, 0, 1, 1), "probe": ints(1)}
    assert conduct.judge_carried([2, [False, True]], right) is None


def test_the_caller_s_error_must_name_the_replica_and_keep_the_message():
    runs = [[4, [[2, 0, "boom 17"]]]]  # replica 2 raises ValueError("boom 17")
    kinds = ints(0)
    for message, fine in [
        ("ValueError in replica 2 on device virtual:2 (cpu): boom 17", True),
        ("ValueError in replica 2 on device virtual:2 (cpu): something else", False),
        ("ValueError: boom 17", False),
    ]:
        values = {"kinds": kinds, "message0": conduct.text(message)}
        hint = conduct.judge_carried_back(runs, values)
        assert (hint is None) == fine, (message, hint)
        if not fine:
            assert "should name replica 2 and keep the original message" in hint


def test_what_was_not_sent_fails_as_not_sent():
    inputs = [1, 1, 0, "boom 3", "worker 5"]
    message = conduct.text("ValueError in replica 1 on device virtual:1 (cpu): worker 5")
    assert conduct.judge_names(inputs, {"kind": ints(0)}) == conduct.NOT_SENT
    assert conduct.judge_names(inputs, {"message": message}) == conduct.NOT_SENT
    assert conduct.judge_names(inputs, {"kind": ints(0), "message": message}) is None

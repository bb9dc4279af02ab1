"""The grading child's pytest plugin, run in this process on checks written here: each
check's record, signed with the key it was handed, says passed only for a check that
returned with no hint; a grader function replaced fails that check and every later one.

A real grading run starts the harness in a fresh process (tests/test_grading_*.py grade
whole classes that way); here its ``main`` runs inside this one, so that what it does is
seen check by check. Two things it does cannot be undone in a process and are left out
here: the warden's audit hook (tests/test_grading_attacks.py meets it in real runs) and
the frozen comparisons on torch's own module (tested below on a module made for it).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
import textwrap
import types

import pytest

from dpkit.grading import harness

KEY = b"a key only this test knows"

CHECKS = '''
import pytest
import dpkit._harness_probe as probe
from dpkit.grading import harness


def test_right():
    """adds up"""


def test_wrong():
    assert 1 + 1 == 3


def test_a_hint(request):
    """says why"""
    harness.record_hint(request.node.nodeid, "the hint " + "x" * 2000)
    harness.record_hint(request.node.nodeid, "a later hint is not kept")


def test_values(request):
    harness.record_values(request.node.nodeid, "encoded outputs")


@pytest.mark.task3
@pytest.mark.parametrize("rows", [2, 5])
def test_rows(rows):
    """rows of a batch"""


def test_replaces_a_grader_function():
    probe.answer = lambda: 41


def test_after_the_replacement():
    """an honest check"""
'''


@pytest.fixture
def probe_module():
    """A module the harness watches (its name starts with dpkit), gone afterwards."""
    module = types.ModuleType("dpkit._harness_probe")
    module.answer = lambda: 42
    sys.modules["dpkit._harness_probe"] = module
    yield module
    del sys.modules["dpkit._harness_probe"]


def run_main(tmp_path, monkeypatch, probe_module):
    """``harness.main`` in this process on CHECKS: the records it wrote, checked for their
    signatures and sequence, as the parent reads them."""
    armed = []  # the warden's audit hook is one-way: noted here, not set
    monkeypatch.setattr(harness.warden, "arm", armed.append)
    monkeypatch.setattr(harness, "freeze_comparisons", lambda: None)  # torch's: not here
    # pytest sets these around each test and clears them after, as the inner run will: in a
    # grading process they are None when the snapshot is taken, and here too
    from _pytest.assertion import util

    monkeypatch.setattr(util, "_reprcompare", None)
    monkeypatch.setattr(util, "_assertion_pass", None)
    (tmp_path / "test_checks.py").write_text(CHECKS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    task3: task 3\n")
    key_read, key_write = os.pipe()
    os.write(key_write, KEY)
    os.close(key_write)
    results = tmp_path / "results"
    results_fd = os.open(results, os.O_WRONLY | os.O_CREAT)
    args = [
        str(key_read),
        str(results_fd),
        "0",
        "--",
        str(tmp_path),
        "-q",
        "-p",
        "no:cacheprovider",
        "-c",
        str(tmp_path / "pytest.ini"),
        "--import-mode=importlib",
    ]
    try:
        status = harness.main(args)
        # armed once, letting only the harness's own wrapper and thread check do what it
        # refuses to everyone else
        assert armed == [frozenset({harness.Harness._watch.__code__,
                                    harness.thread_tampered.__code__})]  # fmt: skip
    finally:
        os.close(results_fd)
        for name in [name for name in sys.modules if "test_checks" in name]:
            del sys.modules[name]  # the inner run's module, under importlib's name
    with pytest.raises(OSError):  # the key's pipe was read and closed
        os.fstat(key_read)
    records = []
    for number, line in enumerate(results.read_text().splitlines()):
        text, signature = line.split("\t")
        expected = hmac.new(KEY, text.encode(), hashlib.sha256).hexdigest()
        assert hmac.compare_digest(signature, expected), line
        record = json.loads(text)
        assert record.pop("seq") == number
        records.append(record)
    return status, records


def test_each_check_s_signed_record_says_what_the_harness_saw(tmp_path, monkeypatch,
                                                              probe_module):  # fmt: skip
    status, records = run_main(tmp_path, monkeypatch, probe_module)
    assert status == 1  # pytest's own status: some checks failed
    collected = [(r["nodeid"].split("::")[1], r["task"], r["check"])
                 for r in records if r["event"] == "collected"]  # fmt: skip
    assert collected == [
        ("test_right", 0, "adds up"),
        ("test_wrong", 0, "test_wrong"),  # no docstring: the test's name
        ("test_a_hint", 0, "says why"),
        ("test_values", 0, "test_values"),
        ("test_rows[2]", 3, "rows of a batch (2)"),
        ("test_rows[5]", 3, "rows of a batch (5)"),
        ("test_replaces_a_grader_function", 0, "test_replaces_a_grader_function"),
        ("test_after_the_replacement", 0, "an honest check"),
    ]
    outcomes = [({k: v for k, v in r.items() if k != "nodeid"}, r["nodeid"].split("::")[1])
                for r in records if r["event"] not in ("collected", "finished")]  # fmt: skip
    tampered = ("the grader was tampered with: dpkit._harness_probe.answer was replaced "
                "while your code ran, so no check counts from here on")  # fmt: skip
    assert outcomes == [
        ({"event": "passed"}, "test_right"),
        ({"event": "failed", "hint": "failed"}, "test_wrong"),
        ({"event": "failed", "hint": ("the hint " + "x" * 2000)[: harness.HINT_LIMIT]},
         "test_a_hint"),
        ({"event": "passed", "values": "encoded outputs"}, "test_values"),
        ({"event": "passed"}, "test_rows[2]"),
        ({"event": "passed"}, "test_rows[5]"),
        ({"event": "failed", "hint": tampered}, "test_replaces_a_grader_function"),
        ({"event": "failed", "hint": tampered}, "test_after_the_replacement"),
    ]  # fmt: skip
    assert records[0]["nodeid"] == "test_checks.py::test_right"  # from the rootdir
    assert records[-1] == {"event": "finished"}
    assert harness._HINTS == {} and harness._VALUES == {}  # each taken by its record


def test_a_check_that_returns_after_its_turn_does_not_count(tmp_path):
    """The watched function counts a return only while its check is the running one."""
    results_fd = os.open(tmp_path / "results", os.O_WRONLY | os.O_CREAT)
    plugin = harness.Harness(hmac.new(KEY, digestmod="sha256"), results_fd)
    check = plugin._watch("t.py::test_late", lambda x: x + 1)
    assert check.__name__ == "<lambda>" and not hasattr(check, "__wrapped__")
    assert check(x=1) == 2  # not its turn (pytest passes arguments by name): not counted
    assert plugin._returned == set()
    plugin._current = "t.py::test_late"
    assert check(x=1) == 2
    assert plugin._returned == {"t.py::test_late"}
    os.close(results_fd)


def test_the_key_is_read_whole_and_its_pipe_closed():
    read, write = os.pipe()
    os.write(write, b"k" * 5000)  # more than one read of 4096
    os.close(write)
    assert harness._read_key(read) == b"k" * 5000
    with pytest.raises(OSError):
        os.fstat(read)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc")
def test_memory_is_capped_at_what_is_used_plus_the_budget(monkeypatch):
    import resource

    used = harness._address_space()
    with open("/proc/self/status") as status:
        size = next(line for line in status if line.startswith("VmSize:"))
    assert used is not None and abs(used - int(size.split()[1]) * 1024) < 64 << 20
    limits = []
    monkeypatch.setattr(resource, "setrlimit", lambda which, pair: limits.append((which, pair)))
    monkeypatch.setattr(harness, "_address_space", lambda: 1000)
    harness._limit_memory(500)
    assert limits == [(resource.RLIMIT_AS, (1500, 1500))]
    harness._limit_memory(0)  # no budget: no limit
    assert len(limits) == 1


def test_comparisons_are_fixed_on_the_module_s_class(monkeypatch):
    module = types.ModuleType("dpkit_test_frozen")
    module.equal = lambda a, b: a == b
    module.other = 1
    monkeypatch.setitem(sys.modules, "dpkit_test_frozen", module)
    monkeypatch.setattr(harness, "FROZEN_COMPARISONS", {"dpkit_test_frozen": ("equal", "gone")})
    original = module.equal
    harness.freeze_comparisons()
    frozen = type(module)
    assert frozen.__name__ == "FrozenModule" and frozen.__dpkit_frozen__
    assert "gone" not in vars(frozen)  # names the module lacks are skipped
    with pytest.raises(AttributeError, match="dpkit_test_frozen.equal is the grader's while"):
        module.equal = lambda a, b: True
    vars(module)["equal"] = lambda a, b: True  # a write to its __dict__ is never read
    assert module.equal is original
    harness.freeze_comparisons()  # a second freeze leaves the first
    assert type(module) is frozen
    module.other = 2  # the rest of the module is as it was
    assert module.other == 2


def test_a_class_named_in_extra_classes_is_snapshotted_under_its_dotted_name(monkeypatch):
    module = types.ModuleType("outside_watch")
    module.Thing = type("Thing", (), {"method": lambda self: 1})
    monkeypatch.setitem(sys.modules, "outside_watch.inner", module)
    monkeypatch.setattr(harness, "EXTRA_CLASSES", ("outside_watch.inner.Thing",))
    snapshot = harness.Snapshot()
    assert snapshot.changed() is None
    monkeypatch.setattr(module.Thing, "method", lambda self: 2)
    assert snapshot.changed() == "outside_watch.inner.Thing.method"


def test_a_name_deleted_from_a_watched_module_is_named(probe_module):
    snapshot = harness.Snapshot()
    del probe_module.answer
    assert snapshot.changed() == "dpkit._harness_probe.answer"


def test_torch_s_own_wrapper_is_not_tampering():
    import torch

    def original():
        return 1

    wrapper = textwrap.dedent(
        """
        def wrapper():
            return original()
        """
    )
    namespace = {"original": original}
    exec(compile(wrapper, os.path.join(os.path.dirname(torch.__file__), "fake.py"), "exec"),
         namespace)  # fmt: skip
    wrapped = namespace["wrapper"]
    wrapped.__wrapped__ = original
    assert harness._torch_wrapper_of(wrapped, original)
    assert not harness._torch_wrapper_of(wrapped, lambda: 1)  # another function inside
    outside = lambda: 1  # noqa: E731 - written outside torch's files
    outside.__wrapped__ = original
    assert not harness._torch_wrapper_of(outside, original)

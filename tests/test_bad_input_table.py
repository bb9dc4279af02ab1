"""The table in ``docs/bad_input.md`` is the contract for the messages users see (issue 32).

Every row whose answer is an error (``ValueError: text`` or ``dpkit: error: ValueError:
text``) is run here and its message compared whole: ``...`` in the doc stands for any text
(at the end: the message goes on), and a space for any whitespace (a table cell cannot hold
the line break some messages have). A row that answers "the same ``ValueError``, naming
``words``" is checked for that error type and those words. The other tests check the
error type and the words that matter, not the exact text.

Each row's case is registered under the row's first column, exactly as the doc writes it:
a row without a case, or a case whose row was renamed, fails
``test_every_row_has_a_case_and_every_case_a_row``.
"""

from __future__ import annotations

import math
import os
import re
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from by_lane import Raises, Returns, StuckOn
from lanes import lanes
from torch import nn

import dpkit
from dpkit import cli

DOC = Path(__file__).resolve().parents[1] / "docs" / "bad_input.md"

# --------------------------------------------------------------------------------------
# the doc's tables

# `ValueError: text` or `dpkit: error: ValueError: text`, then commentary after the backtick
ERROR_ANSWER = re.compile(r"`(?P<cli>dpkit: error: )?(?P<type>[A-Z]\w*): (?P<text>[^`]*)`")
# the same `ValueError`, naming `words` / (`words`); or: that sentence, then the same ...
SAME_ERROR_ANSWER = re.compile(r"(?P<lead>that sentence, then )?the same `(?P<type>[A-Z]\w*)`")
BACKTICKED = re.compile(r"`([^`]*)`")


@dataclass(frozen=True)
class Row:
    section: str
    case: str  # the first column, as written: the key of CASES
    cells: tuple[str, ...]

    @property
    def answer(self) -> str:
        return self.cells[-1]


def table_rows(text: str) -> list[Row]:
    """The body rows of every table in ``text``, with the section each is under."""
    rows, section, in_table = [], "", False
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        if not line.startswith("|"):
            in_table = False
            continue
        cells = tuple(cell.strip() for cell in line.strip().strip("|").split("|"))
        if not in_table:  # the header row; the separator row follows
            in_table = True
        elif not set(line) <= set("|-: "):
            rows.append(Row(section, cells[0], cells))
    return rows


ROWS = table_rows(DOC.read_text(encoding="utf-8"))


def error_answer(row: Row) -> re.Match | None:
    return ERROR_ANSWER.match(row.answer)


def same_error_answer(row: Row) -> re.Match | None:
    return None if error_answer(row) else SAME_ERROR_ANSWER.match(row.answer)


ERROR_ROWS = [row for row in ROWS if error_answer(row)]
SAME_ERROR_ROWS = [row for row in ROWS if same_error_answer(row)]


def documented_pattern(text: str) -> re.Pattern:
    """``text`` as a regex for the whole message: ``...`` is any text, the spaces around it
    included (``register_buffer) ...`` abridges ``register_buffer), which ...``), and a
    space any whitespace."""
    tokens = [token for token in re.split(r"(\.\.\.|\s+)", text) if token]
    parts = []
    for before, token, after in zip([None, *tokens], tokens, [*tokens[1:], None]):
        if token == "...":
            parts.append(".*")
        elif token.isspace():
            parts.append("" if "..." in (before, after) else r"\s+")
        else:
            parts.append(re.escape(token))
    return re.compile("".join(parts), re.DOTALL)


def named_words(row: Row) -> list[str]:
    """What a "the same `ValueError`" row says the message names: its backticked words after
    the type, or, for "that sentence", the torch column's sentence."""
    match = same_error_answer(row)
    if match["lead"]:
        return BACKTICKED.findall(row.cells[1])
    return BACKTICKED.findall(row.answer[match.end() :])


# --------------------------------------------------------------------------------------
# running a case


@dataclass(frozen=True)
class Answer:
    via_cli: bool  # the one stderr line of the dpkit command, or a raised exception
    type_name: str
    message: str


def answer_of(error: BaseException) -> Answer:
    return Answer(False, type(error).__name__, str(error))


def python_error(call: Callable[[], object]) -> Answer:
    try:
        call()
    except BaseException as error:  # SystemExit and KeyboardInterrupt are rows too
        return answer_of(error)
    pytest.fail("no exception was raised")


def cli_error(fx, *argv: str) -> Answer:
    """``dpkit argv`` run in-process (cli.main, the console script), in a scratch folder."""
    fx.monkeypatch.chdir(fx.tmp_path)  # a command that wrongly went on writes nothing here
    fx.monkeypatch.delenv("DPKIT_DEBUG", raising=False)  # which would raise, not print
    fx.capsys.readouterr()
    status = cli.main(list(argv))
    err = fx.capsys.readouterr().err
    assert status == 2, err
    lines = err.splitlines()
    assert len(lines) == 1, f"one line on stderr, not:\n{err}"
    match = re.fullmatch(r"dpkit: error: (\w+): (.*)", lines[0])
    assert match, lines[0]
    return Answer(True, match[1], match[2])


def must_not_start(fx, module, name: str) -> None:
    """Replace ``module.name`` (training, rank processes, writing a course) by a failure:
    the doc says the check comes before anything is written or started."""

    def started(*args, **kwargs):
        raise AssertionError(f"{module.__name__}.{name} ran before the error")

    fx.monkeypatch.setattr(module, name, started)


def replicas_returning(make) -> Answer:
    return python_error(
        lambda: dpkit.data_parallel(Returns(make), torch.randn(8, 2), device_ids=lanes(4))
    )


class Scaled(nn.Module):
    def forward(self, x, m=None):
        return x * m


class OptimizedModule(nn.Module):
    """Stands in for what torch.compile returns (its import takes seconds): the compiled
    module under ``_orig_mod``, as tests/test_bad_input.py's."""

    def __init__(self, module):
        super().__init__()
        self._orig_mod = module

    def forward(self, x):
        return self._orig_mod(x)


def same_answer_from_each(calls: list[Callable[[], object]]) -> Answer:
    """The answer of the first call, after checking that the others give the same one: a
    row that lists several calls documents one message for all of them."""
    answers = [python_error(call) for call in calls]
    assert all(answer == answers[0] for answer in answers), answers
    return answers[0]


# --------------------------------------------------------------------------------------
# the cases, by the doc's first column

CASES: dict[str, Callable[[SimpleNamespace], Answer]] = {}


def case(row: str):
    def register(make):
        assert row not in CASES, f"two cases for {row!r}"
        CASES[row] = make
        return make

    return register


# Hangs and exits


@case("a replica never returns, `DataParallel(m, lanes, timeout=0.2)(x)`")
def _(fx):
    release, before = threading.Event(), set(threading.enumerate())
    parallel = dpkit.DataParallel(StuckOn(release, {1}), device_ids=lanes(4), timeout=0.2)
    try:
        return python_error(lambda: parallel(torch.ones(8, 1)))
    finally:  # the stuck replica returns: no thread is left running after the test
        release.set()
        for thread in set(threading.enumerate()) - before:
            thread.join(timeout=5)


@case(
    "`timeout=0`, `-5`, `nan`, `inf`; `10**400`, `1e300`, `10**10` (past `threading.TIMEOUT_MAX`)"
)
def _(fx):
    def with_timeout(timeout):
        return lambda: dpkit.DataParallel(nn.Linear(2, 2), device_ids=lanes(2), timeout=timeout)

    # the row's note: a number of over 20 characters is shown by its length
    assert "got a number of 401 digits" in python_error(with_timeout(10**400)).message
    return python_error(with_timeout(0))


@case('`timeout="10"`, `timeout=True`')
def _(fx):
    return python_error(
        lambda: dpkit.parallel_apply(
            [nn.Identity()], [torch.ones(1)], devices=lanes(1), timeout="10"
        )
    )


@case("`sys.exit(3)` in replica 2")
def _(fx):
    with pytest.raises(SystemExit) as exited:
        dpkit.data_parallel(Raises(SystemExit(3)), torch.ones(8, 1), lanes(4))
    assert exited.value.code == 3  # the row's "exit status 3"
    return answer_of(exited.value)


@case("`KeyboardInterrupt` raised in replica 2")
def _(fx):
    module = Raises(KeyboardInterrupt())
    return python_error(lambda: dpkit.data_parallel(module, torch.ones(8, 1), lanes(4)))


# Silent wrong results in torch


@case("positional inputs of 8 and 6 rows (onto 2 or more devices; onto one, tensors go whole)")
def _(fx):
    inputs = (torch.randn(8, 3), torch.randn(6, 3))
    return python_error(
        lambda: dpkit.data_parallel(nn.Bilinear(3, 3, 2), inputs, device_ids=lanes(4))
    )


def keyword_tensor_of(rows: int) -> Answer:
    parallel = dpkit.DataParallel(Scaled(), device_ids=lanes(4))
    return python_error(lambda: parallel(torch.randn(8, 3), m=torch.randn(rows, 1)))


@case("a keyword tensor of 4 rows against a batch of 8")
def _(fx):
    return keyword_tensor_of(4)


@case("a keyword tensor of 6 rows against a batch of 8")
def _(fx):
    return keyword_tensor_of(6)


@case("replica 0 returns `None`, the others tensors")
def _(fx):
    return replicas_returning(lambda i, x: None if i == 0 else x)


@case("dicts with other keys")
def _(fx):
    return replicas_returning(lambda i, x: {"a": x} if i == 0 else {"b": x})


@case("dicts with other numbers of keys")
def _(fx):
    return replicas_returning(lambda i, x: {"a": x} if i == 0 else {"a": x, "b": x})


@case("a tensor against a tuple")
def _(fx):
    return replicas_returning(lambda i, x: x if i == 1 else (x,))


@case("tuples of different lengths")
def _(fx):
    # nested, so that the message has both the lengths and the place the row quotes
    return replicas_returning(lambda i, x: {"out": (x, (x, x) if i == 3 else (x,))})


@dataclass
class Prediction:
    logits: torch.Tensor


@case("replicas return a dataclass")
def _(fx):
    return replicas_returning(lambda i, x: Prediction(x))


@case("replicas return strings")
def _(fx):
    return replicas_returning(lambda i, x: "cat")


# Arguments


@case("`output_device=99` with four lanes")
def _(fx):
    return python_error(
        lambda: dpkit.DataParallel(nn.Linear(2, 2), device_ids=lanes(4), output_device=99)
    )


@case("a model made as usual (on lane 0) with `device_ids=lanes[1:]`")
def _(fx):
    parallel = dpkit.DataParallel(nn.Linear(3, 2), device_ids=lanes(3)[1:])
    return python_error(lambda: parallel(torch.randn(4, 3)))


@case("a buffer or parameter left on lane 1 (e.g. a scatter chunk kept as a buffer)")
def _(fx):
    devices = lanes(4)
    model = nn.Linear(2, 2)
    model.register_buffer("shift", dpkit.scatter(torch.randn(8, 2), devices)[1])  # lane 1's
    parallel = dpkit.DataParallel(model, device_ids=devices)
    return python_error(lambda: parallel(torch.randn(8, 2)))


@case("`dim='0'` (DataParallel, data_parallel, scatter, scatter_kwargs, gather)")
def _(fx):
    model, x, devices = nn.Linear(2, 2), torch.randn(4, 2), lanes(2)
    return same_answer_from_each(
        [
            lambda: dpkit.DataParallel(model, device_ids=devices, dim="0"),
            lambda: dpkit.data_parallel(model, x, devices, dim="0"),
            lambda: dpkit.scatter(x, devices, dim="0"),
            lambda: dpkit.scatter_kwargs((x,), None, devices, dim="0"),
            lambda: dpkit.gather([torch.ones(2), torch.ones(2)], devices[0], dim="0"),
        ]
    )


@case("`virtual_devices(2, on='nosuch')`")
def _(fx):
    return python_error(lambda: dpkit.virtual_devices(2, on="nosuch"))


@case(
    "`virtual_devices(10**9, on='cpu')`, `dpkit.devices(100000)` without an accelerator "
    "(or `dpkit demo --devices 100000`; tested in `tests/test_devices.py`)"
)
def _(fx):
    fx.monkeypatch.setattr(os, "cpu_count", lambda: 2)  # the doc's machine: 2 cores
    return python_error(lambda: dpkit.virtual_devices(10**9, on="cpu"))


@case(
    '`dpkit.trace(keep_steps=0)` (or `-3`, `2.5`, `True`, `"10"`; tested in '
    "`tests/test_trace_bound.py`)"
)
def _(fx):
    return python_error(lambda: dpkit.trace(keep_steps=0))


@case("`trace.memory_summary(step=3)` for a step the bound dropped")
def _(fx):
    parallel = dpkit.DataParallel(nn.Linear(2, 2), device_ids=lanes(2))
    with dpkit.trace(keep_steps=5) as bounded:
        for _ in range(8):  # steps 4 to 8 kept
            parallel(torch.randn(4, 2)).sum().backward()
    return python_error(lambda: bounded.memory_summary(step=3))


@case("`parallel_apply(modules, None, ...)`")
def _(fx):
    return python_error(lambda: dpkit.parallel_apply([nn.Identity()] * 2, None, devices=lanes(2)))


@case("a generator for `modules`, `inputs` or `kwargs_tup`")
def _(fx):
    inputs = (x for x in [torch.ones(1), torch.ones(1)])
    return python_error(lambda: dpkit.parallel_apply([nn.Identity()] * 2, inputs, devices=lanes(2)))


@case("a sparse COO or CSR tensor as input")
def _(fx):
    return python_error(lambda: dpkit.scatter(torch.randn(8, 3).to_sparse(), lanes(2)))


@case("a nested tensor as input")
def _(fx):
    with warnings.catch_warnings():  # nested tensors warn that they are a prototype
        warnings.simplefilter("ignore")
        nested = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(3, 3)])
    return python_error(lambda: dpkit.scatter(nested, lanes(2)))


@case("a `torch.compile`d module (or submodule)")
def _(fx):
    compiled = OptimizedModule(nn.Linear(2, 2))
    within = nn.Sequential(nn.Linear(2, 2), compiled)  # the row's "or submodule"
    nested = python_error(lambda: dpkit.replicate(within, lanes(2))).message
    whole = python_error(lambda: dpkit.DataParallel(compiled, device_ids=lanes(2)))
    assert nested == "a submodule of " + whole.message
    return whole


@case("a `chunk_sizes` function returning `None`")
def _(fx):
    return python_error(lambda: dpkit.plan_chunks(8, 4, lambda batch, n: None))


@case("`chunk_sizes` of booleans (`[True] * 8`)")
def _(fx):
    return python_error(lambda: dpkit.plan_chunks(8, 4, [True] * 8))


@case("NaN or infinite `weights`")
def _(fx):
    return python_error(lambda: dpkit.weighted_chunk_sizes(8, 2, weights=[1, math.nan]))


@case('`weights=[1, "2"]`')
def _(fx):
    return python_error(lambda: dpkit.weighted_chunk_sizes(8, 2, weights=[1, "2"]))


@case("`balanced_chunk_sizes(8, 0)`, `plan_chunks(8, -1)`, `torch_chunk_sizes(8, 0)`")
def _(fx):
    # plan_chunks(8, -1) says "got -1": the same message, another number
    assert python_error(lambda: dpkit.plan_chunks(8, -1)).type_name == "ValueError"
    return same_answer_from_each(
        [lambda: dpkit.balanced_chunk_sizes(8, 0), lambda: dpkit.torch_chunk_sizes(8, 0)]
    )


@case("`plan_chunks(-1, 4)`")
def _(fx):
    return python_error(lambda: dpkit.plan_chunks(-1, 4))


# dpkit demo: the folder is checked before any training


def demo_out(fx, out: str) -> Answer:
    must_not_start(fx, dpkit, "DataParallel")
    (fx.tmp_path / "notes.txt").write_text("not a folder")
    return cli_error(fx, "demo", "--out", out)


@case("`--out` names a file")
def _(fx):
    return demo_out(fx, "notes.txt")


@case("`--out` under a file, or where nothing can be written")
def _(fx):
    return demo_out(fx, "notes.txt/figures")


# dpkit course, dpkit ddp, dpkit predict: refused before anything is written or started


def course(fx, folder: str) -> Answer:
    from dpkit import course

    must_not_start(fx, course, "write_course")
    return cli_error(fx, "course", folder)


def ddp(fx, *argv: str, started: str = "run_ddp") -> Answer:
    """``started``: what must not run; "launch_plan" lets run_ddp's own checks answer."""
    from dpkit.ddp import command, nodes, run

    must_not_start(fx, run, started)
    must_not_start(fx, nodes, "train_on_nodes")
    # the doc's machine: 2 cores; and less memory than the 628.8 GB asked, on any machine
    fx.monkeypatch.setattr(command.checks, "cores", lambda: 2)
    fx.monkeypatch.setattr(command, "memory_bytes", lambda: 16 * 10**9)
    return cli_error(fx, "ddp", *argv)


def predict(fx, *argv: str) -> Answer:
    from dpkit.cost import prediction

    must_not_start(fx, prediction, "profile")  # running the model: a prediction's work
    return cli_error(fx, "predict", *argv)


@case('`dpkit course ""`')
def _(fx):
    return course(fx, "")


@case("`dpkit course my-course` where `my-course/notebooks` is a file")
def _(fx):
    # write_course's own check answers: it runs, and must write nothing
    folder = fx.tmp_path / "my-course"
    folder.mkdir()
    (folder / "notebooks").write_text("")
    answer = cli_error(fx, "course", "my-course")
    assert [path.name for path in folder.iterdir()] == ["notebooks"]  # nothing written
    return answer


@case("`dpkit course /proc/foo` (a folder that cannot be made)")
def _(fx):
    return course(fx, "/proc/foo")


@case("`dpkit ddp --nnodes 3 --nproc 4` on 2 cores")
def _(fx):
    return ddp(fx, "--nnodes", "3", "--nproc", "4")


@case("`dpkit ddp --nproc 4 --backend nccl` with 2 GPUs")
def _(fx):
    import torch.distributed as dist

    fx.monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    fx.monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    fx.monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    return ddp(fx, "--nproc", "4", "--backend", "nccl", started="launch_plan")


@case("`dpkit ddp --out notes.txt/runs` (under a file)")
def _(fx):
    (fx.tmp_path / "notes.txt").write_text("not a folder")
    return ddp(fx, "--out", "notes.txt/runs")


@case("`dpkit ddp --batch 100000000`")
def _(fx):
    return ddp(fx, "--batch", "100000000")


@case("`dpkit predict --strategy ddp --devices 100` (batch 256)")
def _(fx):
    return predict(fx, "--strategy", "ddp", "--devices", "100", "--batch", "256")


@case("`dpkit predict --gradient-as-bucket-view` (or `--bucket-cap-mb`) without `--strategy ddp`")
def _(fx):
    return predict(fx, "--gradient-as-bucket-view")


# Rows that are not an error message, and where each is tested.
NOT_MESSAGES = {
    "the same without `timeout=`, then Ctrl-C": "tests/test_hardening_hangs.py",
    "a replica returns a tensor attribute of the module": "tests/test_hardening_results.py",
    "`--devices 1000` with a batch of 256": "tests/test_hardening_demo.py",
}


# --------------------------------------------------------------------------------------
# the tests


@pytest.fixture
def fx(monkeypatch, tmp_path, capsys):
    """What the cases need: to patch, a scratch folder, and the CLI's stderr."""
    return SimpleNamespace(monkeypatch=monkeypatch, tmp_path=tmp_path, capsys=capsys)


def row_id(row: Row) -> str:
    return re.sub(r"\W+", "-", row.case).strip("-")[:60]


@pytest.mark.parametrize("row", ERROR_ROWS, ids=row_id)
def test_the_documented_message(row, fx):
    documented = error_answer(row)
    answer = CASES[row.case](fx)
    # "dpkit: error: ..." rows are a command's stderr line, the others a call's exception
    assert answer.via_cli == bool(documented["cli"])
    assert answer.type_name == documented["type"]
    pattern = documented_pattern(documented["text"])
    assert pattern.fullmatch(answer.message), (
        f"the doc says:\n  {documented['text']}\nthe code says:\n  {answer.message}"
    )


@pytest.mark.parametrize("row", SAME_ERROR_ROWS, ids=row_id)
def test_the_same_error_naming_what_the_row_says(row, fx):
    answer = CASES[row.case](fx)
    assert answer.type_name == same_error_answer(row)["type"]
    words = named_words(row)
    assert words, f"the row names nothing to check: {row.answer}"
    for word in words:
        assert documented_pattern(word).search(answer.message), (word, answer.message)


def test_every_row_has_a_case_and_every_case_a_row():
    checked = {row.case for row in ERROR_ROWS + SAME_ERROR_ROWS}
    assert len(ROWS) == len({row.case for row in ROWS}), "two rows of one name"
    assert sorted(checked - CASES.keys()) == [], "rows without a case"
    assert sorted(CASES.keys() - checked) == [], "cases whose row is gone or renamed"
    others = {row.case for row in ROWS} - checked
    assert others == NOT_MESSAGES.keys(), "a row that is neither a message nor listed"


def test_the_tables_were_read():
    # a change of the table layout must not leave the tests above with nothing to check
    assert len(ERROR_ROWS) >= 30 and len(SAME_ERROR_ROWS) >= 5
    assert {row.section for row in ERROR_ROWS} >= {"Hangs and exits", "Arguments", "`dpkit demo`"}

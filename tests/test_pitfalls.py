"""dpkit.pitfalls and notebook 08: every pitfall's symptom really shows and its fix really fixes.

Each test runs the pitfall on virtual CPU lanes and, where torch can run the same thing on a
CPU (a state_dict, a gather that fails before any tensor moves, a scatter of keyword
arguments, BatchNorm on one row, autocast in a thread), compares with torch's own behaviour.
The last tests keep the notebook and the catalogue in step: a section per pitfall, under
the catalogue's heading, linking the catalogue's reports.
"""

from __future__ import annotations

import inspect
import re
import threading
import warnings
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from torch.nn.parallel import scatter_gather
from torch.nn.parallel.scatter_gather import gather as torch_gather
from torch.utils.data import DataLoader, TensorDataset

import dpkit
from dpkit import pitfalls
from dpkit.pitfalls import timing as step_timing
from dpkit.pitfalls.timing import StepComparison, Timing
from dpkit.verdict import Outcome
from tests.lanes import lanes as cpu_lanes

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "08_pitfalls.ipynb"


@pytest.fixture(scope="module")
def lanes() -> list[dpkit.Device]:
    return cpu_lanes(4)


def parallel(module: nn.Module, lanes: list[dpkit.Device]) -> dpkit.DataParallel:
    return dpkit.DataParallel(module, device_ids=lanes)


def message_of(call, *args, **kwargs) -> str:
    """The message torch's own code raises for a call (to compare dpkit's symptom with)."""
    with pytest.raises(Exception) as raised:
        call(*args, **kwargs)
    return str(raised.value)


# --------------------------------------------------------------------------------------
# attempt, describe, replicas_run


def test_attempt_keeps_the_value_and_the_warnings():
    def warns():
        warnings.warn("careful", UserWarning, stacklevel=1)
        return torch.zeros(2, 3)

    outcome = pitfalls.attempt(warns)
    assert not outcome.raised and outcome.warnings == ["careful"]
    assert str(outcome) == "warning: careful\nreturned tensor[2, 3] float32"


def test_attempt_shows_a_replica_error_as_its_replica_line_and_the_workers_last_line(lanes):
    class Fails(nn.Module):
        def forward(self, x):
            raise KeyError("no such column")

    outcome = pitfalls.attempt(parallel(Fails(), lanes), torch.randn(8, 2))
    first, last = outcome.message_lines()
    assert "in replica 0" in first
    assert last.startswith("... KeyError") and "no such column" in last
    assert "Traceback" not in str(outcome)


def test_describe_shows_tensors_inside_containers_and_other_values_as_their_repr():
    loaded = nn.Linear(2, 2).load_state_dict(nn.Linear(2, 2).state_dict())
    assert pitfalls.describe(loaded) == "<All keys matched successfully>"
    assert pitfalls.describe({"y": torch.ones(3, dtype=torch.int64), "n": 2}) == (
        "{'y': tensor[3] int64, 'n': 2}"
    )


def test_replicas_run_counts_the_replicas_of_a_step_and_none_for_a_plain_call(lanes):
    model = nn.Linear(3, 2)
    assert pitfalls.replicas_run(parallel(model, lanes), torch.randn(10, 3)) == 4
    assert pitfalls.replicas_run(parallel(model, lanes), torch.randn(2, 3)) == 2
    assert pitfalls.replicas_run(model, torch.randn(10, 3)) == 0


# --------------------------------------------------------------------------------------
# 1. slower than one device


def timing(*rounds_ms: float) -> Timing:
    return Timing(tuple(rounds_ms))


def test_the_conclusion_is_dpkit_verdict_s_on_the_paired_rounds():
    apart = StepComparison(16, 4, timing(1, 1.1, 1.2, 1.3, 1.4), timing(20, 21, 22, 23, 24))
    assert apart.conclusion().outcome is Outcome.SLOWER
    assert str(apart.conclusion()).startswith("0.05x (middle half of the rounds: 0.05-0.06x)")
    assert "DataParallel was slower than one device" in str(apart.conclusion())
    # round by round: the step times rise together (another program), the ratio stays near 1
    together = StepComparison(16, 4, timing(1, 2, 3, 4, 5), timing(1.02, 2, 3.03, 3.9, 5.1))
    assert together.conclusion().outcome is Outcome.WITHIN_NOISE
    mixed = StepComparison(16, 4, timing(1, 2, 3, 4, 5), timing(2, 1, 4, 3, 6))
    assert mixed.conclusion().outcome is Outcome.TOO_NOISY


def test_compare_step_times_measures_both_in_the_same_rounds_and_names_a_bad_count(lanes):
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    measured = pitfalls.compare_step_times(model, lanes, batch=8, rounds=4)
    assert len(measured.single.rounds_ms) == len(measured.parallel.rounds_ms) == 4
    assert min(measured.single.rounds_ms + measured.parallel.rounds_ms) > 0
    assert measured.conclusion().rounds == 4
    with pytest.raises(ValueError, match="rounds=3"):
        pitfalls.compare_step_times(model, lanes, batch=8, rounds=3)


def test_every_round_runs_one_step_of_each_back_to_back(lanes, monkeypatch):
    # notebook 05 interleaves its rounds; timed in blocks instead, one program starting
    # midway lands in one side's block only, and 05 and 08 disagreed in one sitting
    order = []

    def step(net, model, inputs):
        order.append("parallel" if isinstance(net, dpkit.DataParallel) else "single")
        return 1.0

    monkeypatch.setattr(step_timing, "_step_ms", step)
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    pitfalls.compare_step_times(model, lanes, batch=8, rounds=5)
    assert order == ["single", "parallel"] * 6  # a warm-up round, then 5


def test_the_model_moves_more_bytes_per_step_than_a_small_batch(lanes):
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    with dpkit.trace() as recorded:
        parallel(model, lanes)(torch.randn(16, 64))
    moved = {
        p: sum(e.nbytes for e in recorded.events if e.phase == p) for p in ("scatter", "replicate")
    }
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert moved["replicate"] == 3 * parameter_bytes
    assert moved["scatter"] == 12 * 64 * 4  # the rows sent to devices 1-3
    assert moved["replicate"] > 10 * moved["scatter"]


# --------------------------------------------------------------------------------------
# 2. device 0 holds more memory


def test_the_output_device_holds_more_until_the_loss_moves_into_forward():
    from dpkit import viz

    outside = list(viz.held_per_device(viz.memory_trace(devices=4, batch=64)).values())
    inside = list(
        viz.held_per_device(viz.memory_trace(devices=4, batch=64, loss="inside")).values()
    )
    assert outside[0] > 1.5 * max(outside[1:])
    assert inside[0] == pytest.approx(max(inside[1:]), rel=0.05)


# --------------------------------------------------------------------------------------
# 3. the last batch is smaller than the device count


@pytest.fixture
def torch_scatter_kwargs(monkeypatch):
    """torch's own scatter_kwargs, runnable without a GPU: its Scatter swapped for the split
    that comm.scatter makes (torch.chunk, chunk_sizes=None), minus the copies. The padding
    rule of keyword and positional chunks, the part under test, stays torch's code."""

    class ChunkOnly:
        @staticmethod
        def apply(target_gpus, chunk_sizes, dim, tensor):
            return tensor.chunk(len(target_gpus), dim)

    monkeypatch.setattr(scatter_gather, "Scatter", ChunkOnly)
    return scatter_gather.scatter_kwargs


def structure(scattered):
    """What each device gets, with tensors as their shapes (to compare dpkit's with torch's)."""
    if isinstance(scattered, torch.Tensor):
        return ("tensor", tuple(scattered.shape))
    if isinstance(scattered, (list, tuple)):
        return type(scattered)(structure(item) for item in scattered)
    if isinstance(scattered, dict):
        return {key: structure(item) for key, item in scattered.items()}
    return scattered


def test_a_short_batch_gets_torchs_padding_empty_inputs_with_a_keyword_flag(
    lanes, torch_scatter_kwargs
):
    two_rows = torch.randn(2, 4)
    for inputs, kwargs in (((two_rows,), {"mode": "predict"}), ((two_rows, "predict"), None)):
        theirs = torch_scatter_kwargs(inputs, kwargs, [0, 1, 2, 3])
        ours = dpkit.scatter_kwargs(inputs, kwargs, lanes)
        assert structure(ours) == structure(theirs), (inputs, kwargs)
    # The keyword flag reaches all 4 devices, the rows only 2: devices 2 and 3 get ().
    inputs, kwargs = dpkit.scatter_kwargs((two_rows,), {"mode": "predict"}, lanes)
    assert [len(args) for args in inputs] == [1, 1, 0, 0]
    assert list(kwargs) == [{"mode": "predict"}] * 4
    # Positionally, the flag is zipped with the chunks: 2 devices, no padding.
    inputs, kwargs = dpkit.scatter_kwargs((two_rows, "predict"), None, lanes)
    assert [len(args) for args in inputs] == [2, 2] and list(kwargs) == [{}, {}]


def test_the_last_batch_fails_in_replica_2_until_drop_last_or_a_positional_flag(lanes):
    dataset = TensorDataset(torch.randn(10, 4))
    wrapped = parallel(pitfalls.Classifier(), lanes)
    outcomes = [
        pitfalls.attempt(wrapped, x, mode="predict") for (x,) in DataLoader(dataset, batch_size=4)
    ]
    assert [outcome.raised for outcome in outcomes] == [False, False, True]
    last = outcomes[-1]
    torchs = message_of(pitfalls.Classifier(), mode="predict")  # device 2's call: no input
    assert isinstance(last.error, TypeError) and "missing 1 required positional" in torchs
    assert last.message_lines()[0].startswith("Caught TypeError in replica 2 on device ")
    assert last.message_lines()[-1] == f"... TypeError: {torchs}"
    # More rows than devices, fewer chunks (6 on 4 is 2, 2, 2): device 3 gets no input.
    six = pitfalls.attempt(wrapped, torch.randn(6, 4), mode="predict")
    assert isinstance(six.error, TypeError) and "in replica 3 " in six.message_lines()[0]

    dropped = DataLoader(dataset, batch_size=4, drop_last=True)
    assert [pitfalls.replicas_run(wrapped, x, mode="predict") for (x,) in dropped] == [4, 4]
    (x,) = list(DataLoader(dataset, batch_size=4))[-1]
    assert pitfalls.replicas_run(wrapped, x, "predict") == 2
    assert torch.allclose(wrapped(x, "predict"), wrapped.module.predict(x))


# --------------------------------------------------------------------------------------
# 4. a chunk of one row breaks BatchNorm


def test_a_one_row_chunk_raises_torchs_batchnorm_error_and_a_safe_batch_does_not(lanes):
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
    outcome = pitfalls.attempt(parallel(model, lanes), torch.randn(10, 4))
    torchs = message_of(nn.BatchNorm1d(8), torch.randn(1, 8))
    assert isinstance(outcome.error, ValueError)
    assert "in replica 3" in outcome.message_lines()[0]
    assert outcome.message_lines()[-1] == f"... ValueError: {torchs}"
    assert 1 in dpkit.torch_chunk_sizes(10, 4) and 1 not in dpkit.torch_chunk_sizes(12, 4)
    assert not pitfalls.attempt(parallel(model, lanes), torch.randn(12, 4)).raised


# --------------------------------------------------------------------------------------
# 5. BatchNorm statistics from device 0's chunk


def test_running_stats_come_from_device_0_until_recomputed_on_one_device(lanes):
    rows = (torch.arange(8.0) * 10).reshape(8, 1)
    norm, one_device = nn.BatchNorm1d(1), nn.BatchNorm1d(1)
    parallel(norm, lanes)(rows)
    one_device(rows)
    chunk0 = dpkit.scatter(rows, lanes)[0]
    assert norm.running_mean.item() == pytest.approx(norm.momentum * chunk0.mean().item())
    assert norm.running_mean.item() != pytest.approx(one_device.running_mean.item())

    norm.reset_running_stats()
    norm.momentum = None
    with torch.no_grad():
        norm(rows)
    assert norm.running_mean.item() == pytest.approx(rows.mean().item())
    assert norm.running_var.item() == pytest.approx(rows.var().item())


# --------------------------------------------------------------------------------------
# 6. the module. prefix


def test_state_dict_keys_carry_module_as_torchs_do_and_both_fixes_load(lanes):
    wrapped = parallel(nn.Linear(4, 2), lanes)
    saved = wrapped.state_dict()
    assert list(saved) == list(nn.DataParallel(nn.Linear(4, 2)).state_dict())
    outcome = pitfalls.attempt(nn.Linear(4, 2).load_state_dict, saved)
    assert isinstance(outcome.error, RuntimeError)
    assert 'Unexpected key(s) in state_dict: "module.weight"' in str(outcome.error)

    assert not pitfalls.attempt(nn.Linear(4, 2).load_state_dict, wrapped.module.state_dict()).raised
    consume_prefix_in_state_dict_if_present(saved, "module.")
    plain = nn.Linear(4, 2)
    plain.load_state_dict(saved)
    assert torch.equal(plain.weight, wrapped.module.weight)


# --------------------------------------------------------------------------------------
# 7. an attribute set in forward


def test_an_attribute_set_in_forward_stays_on_the_replicas_and_a_returned_one_comes_back(lanes):
    model = pitfalls.RemembersFeatures()
    x = torch.randn(8, 4)
    model(x)
    assert hasattr(model, "last_features")  # on one device it works
    del model.last_features
    parallel(model, lanes)(x)
    assert not hasattr(model, "last_features")

    model.return_features = True
    output, features = parallel(model, lanes)(x)
    expected_output, expected_features = model(x)
    assert torch.allclose(features, expected_features) and torch.allclose(output, expected_output)


# --------------------------------------------------------------------------------------
# 8. pack, RNN, unpack


@pytest.fixture
def sequences() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(8, 5, 2), torch.tensor([5, 5, 4, 3, 3, 2, 2, 1])


def test_unpacked_lengths_differ_per_replica_and_fail_to_gather(lanes, sequences):
    padded, lengths = sequences
    encoder = pitfalls.PackedEncoder()
    outcome = pitfalls.attempt(parallel(encoder, lanes), padded, lengths)
    assert outcome.raised
    # One output per chunk, of its own length: torch's gather (C++, on GPUs) refuses their
    # shapes before copying (test_torch_claims); concatenating them fails as well.
    chunks = zip(padded.chunk(4), lengths.chunk(4))
    outputs = [encoder(chunk, chunk_lengths) for chunk, chunk_lengths in chunks]
    assert [o.shape[1] for o in outputs] == [5, 4, 3, 2]
    assert "Sizes of tensors must match" in message_of(torch.cat, outputs)


def test_total_length_makes_every_replica_pad_to_the_input_and_matches_one_device(lanes, sequences):
    padded, lengths = sequences
    encoder = pitfalls.PackedEncoder(total_length=True)
    on_four = parallel(encoder, lanes)(padded, lengths)
    assert torch.allclose(on_four, encoder(padded, lengths), atol=1e-6)
    assert torch.allclose(on_four, parallel(encoder, lanes[:2])(padded, lengths), atol=1e-6)


# --------------------------------------------------------------------------------------
# 9. strings and numbers


def test_torch_turns_a_string_into_a_map_and_fails_on_a_number_dpkit_refuses_both(lanes):
    assert torch_gather(["v1", "v1"], "cpu").startswith("<map object at")
    assert message_of(torch_gather, [2, 2], "cpu") == "'int' object is not iterable"
    for label, kind in (("string", "str"), ("number", "int")):
        outcome = pitfalls.attempt(
            parallel(pitfalls.LabelledOutput(label), lanes), torch.randn(8, 4)
        )
        assert isinstance(outcome.error, TypeError)
        assert f"outputs of type {kind}" in str(outcome.error)


def test_only_tensors_gather_one_count_per_replica(lanes):
    gathered = parallel(pitfalls.LabelledOutput("tensor"), lanes)(torch.randn(10, 4))
    assert gathered["scores"].shape == (10, 2)
    assert gathered["rows"].tolist() == [3, 3, 3, 1]
    with pytest.raises(ValueError, match="label must be"):
        pitfalls.LabelledOutput("dataclass")


# --------------------------------------------------------------------------------------
# 10-11. a scalar loss, and the mean of means


@pytest.fixture
def batch() -> tuple[torch.Tensor, torch.Tensor, nn.Module]:
    torch.manual_seed(0)
    return torch.randn(10, 4), torch.randint(0, 3, (10,)), pitfalls.Classifier()


def test_a_scalar_loss_gathers_into_a_vector_that_backward_refuses_as_torch_does(lanes, batch):
    features, labels, classifier = batch
    loss = pitfalls.attempt(parallel(pitfalls.ChunkLoss(classifier), lanes), features, labels)
    assert loss.value.shape == (4,)
    assert loss.warnings and loss.warnings[0].startswith("Was asked to gather along dimension 0")
    torchs = message_of((torch.ones(2, requires_grad=True) * 2).backward)
    assert str(pitfalls.attempt(loss.value.backward).error) == torchs
    assert not pitfalls.attempt(loss.value.mean().backward).raised


def test_the_mean_of_means_is_off_for_uneven_chunks_and_sums_are_exact(lanes, batch):
    features, labels, classifier = batch
    means = pitfalls.attempt(
        parallel(pitfalls.ChunkLoss(classifier), lanes), features, labels
    ).value
    batch_loss = nn.functional.cross_entropy(classifier(features), labels)
    assert not torch.allclose(means.mean(), batch_loss)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a 1-element sum per replica: no scalar warning
        sums = parallel(pitfalls.ChunkLoss(classifier, "sum"), lanes)(features, labels)
    assert torch.allclose(sums.sum() / len(labels), batch_loss)
    with pytest.raises(ValueError, match="reduction must be"):
        pitfalls.ChunkLoss(classifier, "none")


# --------------------------------------------------------------------------------------
# 12. parameters not on device_ids[0]


def test_a_model_off_device_ids_0_raises_torchs_words_and_lane_0_first_runs(lanes):
    model = nn.Linear(4, 2)
    outcome = pitfalls.attempt(parallel(model, lanes[1:]), torch.randn(6, 4))
    source = inspect.getsource(inspect.getmodule(nn.DataParallel))  # torch's own wording
    assert '"module must have its parameters and buffers "' in source
    assert "on device {self.src_device_obj} (device_ids[0]) but found one of " in source
    assert isinstance(outcome.error, RuntimeError)
    message = str(outcome.error)  # torch's words, then dpkit's fix (whole: docs/bad_input.md)
    assert message.startswith(
        f"module must have its parameters and buffers on device {lanes[1]} (device_ids[0]) "
        "but found one of them on device: cpu; "
    )
    fix = message.partition("a module you create sits on lane 0")[2]
    assert "list lane 0 first: use device_ids=dpkit.virtual_devices(n)" in fix
    assert pitfalls.attempt(parallel(model, lanes), torch.randn(6, 4)).value.shape == (6, 2)


# --------------------------------------------------------------------------------------
# 13. autocast is thread-local


def dtype_in_a_thread(autocast_inside: bool) -> torch.dtype:
    seen = []

    def run():
        if autocast_inside:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                seen.append(nn.Linear(4, 4)(torch.randn(2, 4)).dtype)
        else:
            seen.append(nn.Linear(4, 4)(torch.randn(2, 4)).dtype)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
    return seen[0]


def test_autocast_stays_in_its_thread_unless_entered_there_or_carried_by_parallel_apply(lanes):
    assert dtype_in_a_thread(autocast_inside=False) == torch.float32
    assert dtype_in_a_thread(autocast_inside=True) == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert parallel(nn.Linear(4, 4), lanes)(torch.randn(8, 4)).dtype == torch.bfloat16


# --------------------------------------------------------------------------------------
# 14. hooks


def test_a_module_hook_runs_per_replica_and_a_wrapper_hook_once(lanes):
    calls = []
    linear = nn.Linear(4, 2)
    wrapped = parallel(linear, lanes)
    hook = linear.register_forward_hook(lambda module, inputs, output: calls.append(len(output)))
    wrapped(torch.randn(14, 4))
    hook.remove()
    assert sorted(calls) == [2, 4, 4, 4]
    calls.clear()
    hook = wrapped.register_forward_hook(lambda module, inputs, output: calls.append(len(output)))
    wrapped(torch.randn(14, 4))
    hook.remove()
    assert calls == [14]


# --------------------------------------------------------------------------------------
# 15. custom methods


def test_a_custom_method_is_missing_on_both_wrappers_and_bypasses_the_replicas(lanes):
    wrapped = parallel(pitfalls.Classifier(), lanes)
    ours = pitfalls.attempt(getattr, wrapped, "predict")
    torchs = pitfalls.attempt(getattr, nn.DataParallel(pitfalls.Classifier()), "predict")
    assert isinstance(ours.error, AttributeError) and str(ours) == str(torchs)
    x = torch.randn(8, 4)
    assert pitfalls.replicas_run(wrapped.module.predict, x) == 0
    assert pitfalls.replicas_run(wrapped, x, mode="predict") == 4
    assert torch.allclose(wrapped(x, mode="predict"), wrapped.module.predict(x))


# --------------------------------------------------------------------------------------
# The catalogue and the notebook


def test_the_catalogue_numbers_at_least_14_pitfalls_in_order_with_checked_links():
    numbers = [entry.number for entry in pitfalls.PITFALLS]
    assert len(numbers) >= 14 and numbers == list(range(1, len(numbers) + 1))
    assert len({entry.key for entry in pitfalls.PITFALLS}) == len(numbers)
    for entry in pitfalls.PITFALLS:
        assert entry.links, f"pitfall {entry.number} links no report"
        for link in entry.links:
            repo, number = link.label.split("#")
            assert re.fullmatch(rf"https://github\.com/{repo}/(issues|pull)/{number}", link.url)
    with pytest.raises(KeyError, match="known ones are"):
        pitfalls.pitfall("no such pitfall")


def test_contents_and_reading_list_name_every_pitfall():
    contents = pitfalls.contents()._repr_markdown_()
    reading = pitfalls.reading_list()._repr_markdown_()
    for entry in pitfalls.PITFALLS:
        assert f"| {entry.number} |" in contents and entry.title in contents
        assert all(link.url in reading for link in entry.links)


def sections(notebook) -> dict[int, str]:
    """The markdown of each numbered section, by its number."""
    found: dict[int, list[str]] = {}
    number = None
    for cell in notebook.cells:
        if cell.cell_type != "markdown":
            continue
        heading = re.match(r"## (\d+)\. ", cell.source)
        if heading:
            number = int(heading.group(1))
        elif cell.source.startswith("## "):
            number = None
        if number is not None:
            found.setdefault(number, []).append(cell.source)
    return {number: "\n".join(texts) for number, texts in found.items()}


def test_the_notebook_has_a_section_per_pitfall_under_its_heading_linking_its_reports():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    by_number = sections(notebook)
    assert sorted(by_number) == [entry.number for entry in pitfalls.PITFALLS]
    for entry in pitfalls.PITFALLS:
        text = by_number[entry.number]
        assert text.startswith(entry.heading), f"section {entry.number}: {text[:60]!r}"
        linked = set(re.findall(r"\]\((https://[^)]+)\)", text))
        assert linked >= {link.url for link in entry.links}, f"section {entry.number}"
    last = notebook.cells[-1].source
    assert "Next:" in last and "exercises" in last

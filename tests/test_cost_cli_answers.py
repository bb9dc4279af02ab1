"""What ``dpkit predict`` (dpkit.cost.cli) prints around its numbers: the settings in words,
the files it wrote as a block of their own, and where to open the trace."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from dpkit.cli import main
from dpkit.cost import prediction
from dpkit.cost.cli import report


def _printed(capsys, tmp_path, *flags: str) -> list[str]:
    model = [] if "--model" in flags else ["--model", "mlp"]
    command = ["predict", "--hardware", "8xA100-SXM-NVLink", *model, *flags]
    assert main([*command, "--out", str(tmp_path)]) == 0
    return capsys.readouterr().out.splitlines()


def test_a_ddp_run_states_its_settings_and_torchs_bucket_sizes_in_words(
    capsys, tmp_path, predict_models_built_once
):
    lines = _printed(capsys, tmp_path, "--strategy", "ddp", "--amp", "bf16", "--optimizer", "adam")
    # torch's DDP defaults, which the prediction assumed: 25 MiB buckets, the first one
    # dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB)
    assert prediction.DDP_FIRST_BUCKET_BYTES == dist._DEFAULT_FIRST_BUCKET_BYTES
    mib = prediction.DDP_BUCKET_BYTES / 2**20, prediction.DDP_FIRST_BUCKET_BYTES / 2**20
    buckets = f"torch's buckets: {mib[0]:g} MiB, the first {mib[1]:g} MiB"
    assert f"  autocast bf16; optimizer adam; {buckets}" in lines


def test_the_files_written_are_a_block_of_their_own_then_where_to_open_the_trace(
    capsys, tmp_path, predict_models_built_once
):
    lines = _printed(capsys, tmp_path)
    verdict = next(i for i, line in enumerate(lines) if line.startswith("predicted memory:"))
    assert lines[verdict + 1] == ""  # a blank line, then one line per file written
    files = lines[verdict + 2 : -1]
    assert files and all(str(tmp_path) in line or "skipped" in line for line in files)
    assert any(line.endswith(str(tmp_path / "trace.json")) for line in files)
    # the last line tells where the trace opens: the URL at the start, to click or copy
    assert lines[-1].startswith("  open trace.json at https://ui.perfetto.dev"), lines[-1]


def test_the_settings_line_lists_each_setting_as_given(predict_models_built_once):
    from dpkit.cost import predict
    from dpkit.models import build_model, sample_input

    trace = predict(build_model("mlp", seed=0), sample_input(), 64, 2, "8xA100-SXM-NVLink")
    text = report(trace, "mlp", {}, ["float32", "optimizer sgd"])
    assert "\n  float32; optimizer sgd\n" in text


def test_the_allreduce_note_counts_device_0s_buckets_in_the_last_step(
    capsys, tmp_path, predict_models_built_once
):
    # the wide model's gradients go in torch's 2 buckets (a 1 MiB first one, then the rest:
    # notebook 07), and the second waits for backward: a gap between the two all-reduces
    lines = _printed(capsys, tmp_path, "--strategy", "ddp", "--model", "wide")
    note = next(line for line in lines if "all-reduces took" in line)
    assert "in the last step device 0's 2 all-reduces took" in note
    took, of = (float(part.split(" ms")[0]) for part in note.split("took ")[1].split("of those "))
    row = next(line for line in lines if line.startswith("allreduce "))
    assert of == float(row.split()[1])  # the table's allreduce time, gaps included
    assert 0 < took < of


def test_both_autocast_dtypes_and_bucket_views_are_named_in_the_settings_line(
    capsys, tmp_path, predict_models_built_once
):
    flags = ("--strategy", "ddp", "--amp", "fp16", "--gradient-as-bucket-view")
    settings = next(line for line in _printed(capsys, tmp_path, *flags) if "autocast" in line)
    assert settings.startswith("  autocast fp16; optimizer sgd; ")
    assert settings.endswith("; gradient_as_bucket_view")


def test_an_unknown_model_is_refused_by_name_with_the_course_models(capsys, tmp_path):
    with pytest.raises(SystemExit) as refused:
        main(["predict", "--model", "resnet", "--out", str(tmp_path)])
    assert refused.value.code == 2  # argparse's usage error, before any work
    error = capsys.readouterr().err
    assert "--model: invalid choice: 'resnet'" in error and "'mlp'" in error


def test_the_bucket_cap_s_help_says_it_caps_the_first_bucket_too(capsys):
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--bucket-cap-mb MiB ddp's cap, the first bucket's too (default: torch's" in text

"""``dpkit demo`` (issue 18): a bad ``--out`` is a message before any training, and only the
devices that got a chunk of the batch are listed as used. In-process, to stay fast."""

from __future__ import annotations

import pytest
import torch

import dpkit
from dpkit import cli, demo, models


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a folder")
    return path


@pytest.mark.parametrize(
    "where, message",
    [
        (lambda file: file, r"is a file, not a folder; pass a folder"),
        (lambda file: file / "figures", r"cannot be written to \(Not a directory\)"),
    ],
    ids=["a-file", "under-a-file"],
)
def test_demo_out_that_is_not_a_writable_folder_is_a_message(
    a_file, where, message, monkeypatch, capsys
):
    trained = []
    monkeypatch.setattr(demo.dpkit, "DataParallel", lambda *a, **k: trained.append(1))
    monkeypatch.delenv("DPKIT_DEBUG", raising=False)
    assert cli.main(["demo", "--out", str(where(a_file))]) == 2
    error = capsys.readouterr().err
    assert error.startswith("dpkit: error: ValueError: out=") and "(--out)" in error
    assert len(error.strip().splitlines()) == 1  # a message, not a traceback
    with pytest.raises(ValueError, match=message):
        demo.output_folder(where(a_file))
    assert not trained, "the folder is checked before any training"


def test_demo_makes_a_missing_output_folder(tmp_path):
    folder = demo.output_folder(tmp_path / "new" / "figures")
    assert folder.is_dir() and folder.is_absolute()


def test_demo_lists_only_the_devices_that_got_a_chunk(tmp_path):
    # The demo's steps without its figures (matplotlib takes seconds to load).
    chosen = dpkit.devices(6)
    model = dpkit.to_device(models.build_model("mlp"), chosen[0])
    images = dpkit.to_device(torch.randn(4, *models.IMAGE_SHAPE), chosen[0])
    with dpkit.trace() as recorded:
        dpkit.DataParallel(model, device_ids=chosen)(images).sum().backward()
    result = demo.DemoResult(recorded, chosen, tmp_path / "trace.json", None, None)
    text = demo.report(result, devices=6, batch=4, model="mlp", steps=1)
    used = next(line for line in text.splitlines() if line.startswith("devices used:"))
    apply_devices = {e.device for e in recorded.events if e.phase == "apply"}
    assert len(apply_devices) == 4  # 4 rows over 6 devices: torch.chunk uses 4
    assert all(name in used for name in apply_devices)
    assert chosen[4].name not in used and chosen[5].name not in used
    assert used.endswith("4 of 6 got a chunk of the batch")

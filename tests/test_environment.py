"""dpkit.check_environment(): the course's readiness check (notebook 00 runs it first)."""

from __future__ import annotations

import importlib

import dpkit
from dpkit.environment import EnvironmentReport

GRADING = {"pytest": "9.2.0", "hypothesis": "6.170.17"}  # what dpkit grade needs


def test_check_environment_prints_a_line_per_item_and_a_verdict(capsys):
    report = dpkit.check_environment()
    printed = capsys.readouterr().out
    assert printed.strip() == str(report).strip()
    assert any(line.endswith("(needs >= 2.4)") and "torch" in line for line in report.lines)
    verdict = str(report).splitlines()[-1]
    assert verdict == "ready for the course" if report.ok else verdict.startswith("not ready")


def test_a_missing_requirement_fails_and_a_missing_extra_only_notes():
    report = EnvironmentReport()
    report.add(False, "an extra", required=False)
    assert report.ok and report.lines == ["note  an extra"]
    report.add(False, "a requirement")
    assert not report.ok and report.lines[-1] == "FAIL  a requirement"


def test_the_check_and_its_module_have_different_names():
    module = importlib.import_module("dpkit.environment")
    assert dpkit.environment is module  # not shadowed by a function, as dpkit.check was
    assert module.check_environment is dpkit.check_environment
    assert "check_environment" in dpkit.__all__ and not hasattr(dpkit, "check")


def test_dpkit_check_prints_the_report_and_exits_0_when_ready(capsys):
    from dpkit.cli import main

    status = main(["check"])
    printed = capsys.readouterr().out
    assert printed.strip().endswith("ready for the course") and status == 0


def test_on_colab_the_widgets_need_no_jupyterlab_extension(monkeypatch, capsys):
    from dpkit import environment

    versions = {"ipywidgets": "8.1.9", "matplotlib": "3.11.2", **GRADING}  # no jupyterlab_widgets
    monkeypatch.setattr(environment, "_version", versions.get)
    assert not environment.check_environment(verbose=False).ok  # in JupyterLab: FAIL
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20261201-060000_RC00")
    report = environment.check_environment(verbose=False)
    assert report.ok and any("Colab" in line for line in report.lines)


def test_the_classic_notebook_s_widget_extension_is_enough(monkeypatch):
    from dpkit import environment

    versions = {"ipywidgets": "8.1.9", "widgetsnbextension": "4.0.14", "matplotlib": "3.11.2",
                **GRADING}  # fmt: skip
    monkeypatch.setattr(environment, "_version", versions.get)
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    assert environment.check_environment(verbose=False).ok


def test_the_check_fails_without_the_grading_tools(monkeypatch):
    """dpkit grade runs the graders with pytest and hypothesis: a learner's environment
    without them used to pass the check, then crash at the first grade."""
    from dpkit import environment

    real = environment._version
    monkeypatch.setattr(environment, "_version", lambda p: None if p == "hypothesis" else real(p))
    report = environment.check_environment(verbose=False)
    assert not report.ok
    assert any(line.startswith("FAIL") and "hypothesis missing" in line for line in report.lines)

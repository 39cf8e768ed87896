"""Defects a new user met on a first try (issue 35), each pinned by a test that failed before its fix."""

import importlib
import sys

import pytest
from typer.testing import CliRunner

from manytask.cli import app


def test_the_mas_package_is_what_the_natural_import_gives():
    from manytask.methods import mas

    assert mas is importlib.import_module("manytask.methods.mas")
    assert callable(mas.best_partition) and callable(mas.self_affinity)


MISSING = [  # (the module an extra installs, a command line that needs it, the extra)
    ("optuna", ["tune", "--trials", "1", "rounds=1"], "tune"),
    ("flwr", ["run", "engine=flower-sim", "rounds=1"], "flower"),
    ("transformers", ["run", "configs/talos/scene_objects_protocol.yaml", "rounds=1", "model.pretrained=false"],
     "vision"),
]


@pytest.mark.parametrize(("module", "arguments", "extra"), MISSING, ids=[m for m, _, _ in MISSING])
def test_a_missing_extra_is_named_in_one_sentence_and_nothing_is_written(module, arguments, extra, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: its import raises ModuleNotFoundError
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [*arguments, "--out", str(out), "--quiet"] if arguments[0] == "run"
                                else [*arguments, "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert f"the '{extra}' extra installs" in lines[0] and f"pip install 'manytask[{extra}]'" in lines[0], lines[0]
    assert not out.exists()


def test_require_names_the_extra_only_for_the_missing_module_itself(monkeypatch):
    from manytask.errors import ManytaskError
    from manytask.extras import require

    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(ManytaskError, match=r"^manytask tune needs optuna, which the 'tune' extra installs"):
        require("optuna", "manytask tune")
    assert require("json", "anything").dumps([1]) == "[1]"

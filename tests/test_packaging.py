"""What an installer sees: one version everywhere, torch as a range the set-up's pin satisfies, the license and
type marker shipped."""

import importlib.metadata
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

import manytask

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_one_version_in_pyproject_the_package_and_the_changelog():
    assert PROJECT["version"] == manytask.__version__
    assert f"## {manytask.__version__}" in (ROOT / "CHANGELOG.md").read_text()


def test_torch_is_a_range_that_the_set_ups_pin_satisfies_and_the_installed_metadata_carries():
    (torch,) = [Requirement(r) for r in PROJECT["dependencies"] if Requirement(r).name == "torch"]
    assert len(torch.specifier) == 2 and "2.13.0" in torch.specifier and "2.11.0" in torch.specifier
    assert "2.14.0" not in torch.specifier  # a release no test has run on
    makefile = (ROOT / "Makefile").read_text()  # the CPU pin first, then the package: pip keeps the pinned torch
    assert makefile.index("pip install --quiet torch==2.13.0") < makefile.index('pip install --quiet -e ".')
    assert "make test" in (ROOT / ".ci/run").read_text()
    installed = [Requirement(r) for r in importlib.metadata.requires("manytask") or []]
    assert str(torch) in [str(r) for r in installed if r.name == "torch"]


def test_the_license_and_the_type_marker_ship():
    assert "Apache License" in (ROOT / "LICENSE").read_text() and PROJECT["license"] == {"text": "Apache-2.0"}
    assert (Path(manytask.__file__).parent / "py.typed").exists()
    assert "py.typed" in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "manytask"]

"""Your own code without editing the package: a config's `imports` (modules and .py files, imported before the
config is resolved, paths relative to the config file and stored absolute) and installed packages' entry points."""

import importlib
import textwrap

import pytest
import yaml
from typer.testing import CliRunner

from manytask.benchmarks.registry import BENCHMARKS
from manytask.cli import app
from manytask.config import resolve, validate
from manytask.errors import ManytaskError
from tests.conftest import small_config_dict

BENCH = """
from manytask.benchmarks import Benchmark, register_benchmark
from manytask.benchmarks.synthetic import SyntheticParams, synthetic


@register_benchmark({name!r}, SyntheticParams, "a test's own benchmark")
def mine(params, seed):
    return synthetic(params, seed)
"""


def write_bench(folder, file, name):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / file).write_text(textwrap.dedent(BENCH.format(name=name)))
    return folder / file


def test_a_file_named_relative_to_its_config_registers_before_the_config_resolves(tmp_path, monkeypatch):
    write_bench(tmp_path / "conf" / "code", "bench_a.py", "user-bench-a")
    config = tmp_path / "conf" / "run.yaml"
    config.write_text(yaml.safe_dump(small_config_dict(imports=["code/bench_a.py"], benchmark="user-bench-a")))
    monkeypatch.chdir(tmp_path)  # not the config's folder: the path is the config's
    resolved = resolve(str(config), [])
    assert resolved.imports == [str(tmp_path / "conf" / "code" / "bench_a.py")]
    assert BENCHMARKS.get("user-bench-a").description == "a test's own benchmark"
    again = validate(resolved.model_dump(mode="json"))  # the stored config re-imports nothing twice
    assert again == resolved


def test_a_module_on_the_path_is_imported_by_name_and_an_override_path_is_the_cwds(tmp_path, monkeypatch):
    write_bench(tmp_path / "pkg_user_b", "__init__.py", "user-bench-b")
    write_bench(tmp_path / "here", "bench_c.py", "user-bench-c")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path / "here")
    config = validate(small_config_dict(imports=["pkg_user_b", "bench_c.py"], benchmark="user-bench-b"))
    assert config.imports == ["pkg_user_b", str(tmp_path / "here" / "bench_c.py")]
    assert {"user-bench-b", "user-bench-c"} <= set(BENCHMARKS.names())


BAD = [  # (the imports entry, what the one sentence says)
    ("no_such_module_xyz", "imports: no module named 'no_such_module_xyz' on the Python path"),
    ("missing/file.py", "is not a .py file that exists"),
    ("not a module!", "is neither a module name (a.b.c) nor a path to a .py file"),
    ("raises.py", "imports: '{dir}/raises.py' failed: ZeroDivisionError: division by zero (line 3 of raises.py)."),
]


@pytest.mark.parametrize(("entry", "message"), BAD, ids=[e for e, _ in BAD])
def test_a_bad_import_is_one_sentence_and_nothing_is_written(entry, message, tmp_path, monkeypatch):
    (tmp_path / "raises.py").write_text("import math\n\nvalue = 1 / 0\n")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", f"imports=[{entry}]", "--out", str(out), "--quiet"])
    assert result.exit_code == 2, result.output
    assert message.format(dir=tmp_path) in " ".join(result.stderr.split()) and "Traceback" not in result.output
    assert not out.exists()
    with pytest.raises(ManytaskError, match=r"must be a list of module names or \.py file paths"):
        validate(small_config_dict(imports="bench.py"))


def test_an_installed_packages_entry_points_add_names_when_looked_up(tmp_path, monkeypatch):
    write_bench(tmp_path / "ep_pkg", "__init__.py", "entry-bench")
    (tmp_path / "ep_pkg" / "empty.py").write_text("")
    info = tmp_path / "ep_pkg-1.0.dist-info"  # what `pip install` writes for a package that declares entry points
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-pkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[manytask.benchmarks]\nentry-bench = ep_pkg\nhollow-bench = ep_pkg.empty\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert BENCHMARKS.get("entry-bench").description == "a test's own benchmark"
    assert validate(small_config_dict(benchmark="entry-bench")).benchmark == {"name": "entry-bench"}
    with pytest.raises(ManytaskError, match=r"^the entry point 'hollow-bench' \(group manytask.benchmarks\) loaded, "
                       "but registered no benchmark 'hollow-bench'"):
        BENCHMARKS.get("hollow-bench")

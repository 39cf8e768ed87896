"""A battery of bad inputs to `manytask run CONFIG [key=value ...] --out DIR`.

Every one must end with exit code 2 and one sentence on stderr (`error: ...`), without a traceback, without echoing
unbounded input, and without writing anything: --out is not created (nor is anything else)."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from manytask.cli import app
from tests.conftest import small_config_dict

runner = CliRunner()

DIRECTORY = object()  # the config argument is a directory
MISSING = object()  # the config argument names no file
LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{name}: &{name} [{', '.join(['*' + prev] * 10)}]\n" for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
)
FLOW_LAUGHS = "[&a [1,1,1,1,1,1,1,1,1,1], " + ", ".join(
    f"&{name} [{','.join(['*' + prev] * 10)}]" for prev, name in zip("abcdef", "bcdefg", strict=True)
) + "]"
LONG = "x" * 5000


def small_yaml(**overrides: object) -> str:
    return yaml.safe_dump(small_config_dict(**overrides))


@dataclass
class Case:
    args: list[str]
    expected: str  # a fragment of the one error sentence
    config: object = None  # None: the small config; str: YAML text; bytes: raw bytes; DIRECTORY; MISSING
    out: str = "out"  # relative to tmp_path ("a-file" exists as a file there), or absolute
    extra: list[str] = field(default_factory=list)  # more CLI arguments before --out


def case(args: list[str] | str, expected: str, id: str, **kw: object) -> object:
    return pytest.param(Case([args] if isinstance(args, str) else args, expected, **kw), id=id)


WIDTHS = "layer widths must be whole numbers from 1 to 65536"
NOT_YAML = "is not valid YAML"
CASES = [
    # --- the known failures of issue 17, item 7 ---
    case("federation.num_clients=1000000000", "less than or equal to 1000000", "clients-1e9"),
    case("model.hidden=[-5]", WIDTHS, "hidden-negative"),
    case("model.hidden=[1000000000]", WIDTHS, "hidden-huge"),
    case("model.hidden=[0]", WIDTHS, "hidden-zero"),
    case("seed=-1", "config key 'seed' is invalid: input should be greater than or equal to 0", "seed-negative"),
    case([], "is not a YAML text file", "config-png", config=b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"),
    case([], "is not a YAML text file", "config-random-bytes", config=random.Random(17).randbytes(600)),
    case([], "is not a YAML text file", "config-latin1", config="name: caf\xe9\n".encode("latin-1")),
    case([], "is an existing file, not a directory", "out-is-a-file", out="a-file"),
    case([], "cannot create the run directory", "out-under-proc", out="/proc/manytask-bad-inputs/out"),
    case([], "expands to more than 100,000 values through its aliases", "billion-laughs", config=LAUGHS),
    case([], "expands to more than 100,000 values", "billion-laughs-in-valid-config",
         config=small_yaml() + LAUGHS.replace("a: &a", "junk: &a")),
    case("train.lr=.inf", "config key 'train.lr' is invalid: it must be a finite number (got inf)", "lr-inf"),
    case("train.lr=.nan", "config key 'train.lr' is invalid: it must be a finite number (got nan)", "lr-nan"),
    case("train.lr=-0.1", "config key 'train.lr' is invalid: input should be greater than 0", "lr-negative"),
    case("train.lr=0", "config key 'train.lr' is invalid: input should be greater than 0", "lr-zero"),
    # --- wrong types ---
    case("rounds=x", "config key 'rounds' is invalid: input should be a valid integer", "rounds-text"),
    case("participation=a lot", "config key 'participation' is invalid: input should be a valid number",
         "participation-text"),
    case("model.hidden=5", "parameter 'hidden' of backbone 'mlp' is invalid (input should be a valid list",
         "hidden-not-a-list"),
    case("model.hidden=[a]", "parameter 'hidden.0' of backbone 'mlp' is invalid", "hidden-text-width"),
    case("federation=[1,2]", "config key 'federation' is invalid: input should be a valid dictionary",
         "federation-list"),
    case("seed=abc", "config key 'seed' is invalid: input should be a valid integer", "seed-text"),
    case("train.batch_size=3.5", "config key 'train.batch_size' is invalid", "batch-size-fraction"),
    case("train=5", "config key 'train' is invalid", "train-scalar"),
    case("method=[]", "the method list is empty", "method-empty-list"),
    case("method=5", "config key 'method' is invalid: expected a name or a mapping with a 'name' entry",
         "method-number"),
    case("benchmark={tasks: [digit]}", "config key 'benchmark' is invalid: expected a name or a mapping with a "
         "'name' entry", "benchmark-without-name"),
    case("engine=gpu", "config key 'engine' is invalid: input should be 'local', 'flower-sim' or 'flower'",
         "engine-unknown"),
    case("device=tpu", "config key 'device' is invalid: input should be 'auto', 'cpu', 'cuda' or 'cuda:N'",
         "device-unknown"),
    case("execution=parallel", "config key 'execution' is invalid", "execution-unknown"),
    case("eval_every=1.5", "config key 'eval_every' is invalid", "eval-every-fraction"),
    case("method.train=5", "'train' must map train settings to values", "method-train-scalar"),
    # --- out-of-range values ---
    case("participation=0", "config key 'participation' is invalid: input should be greater than 0",
         "participation-zero"),
    case("participation=1.5", "config key 'participation' is invalid: input should be less than or equal to 1",
         "participation-above-one"),
    case("participation=-0.1", "config key 'participation' is invalid", "participation-negative"),
    case("rounds=0", "config key 'rounds' is invalid: input should be greater than or equal to 1", "rounds-zero"),
    case("rounds=-3", "config key 'rounds' is invalid: input should be greater than or equal to 1", "rounds-negative"),
    case("train.batch_size=0", "config key 'train.batch_size' is invalid", "batch-size-zero"),
    case("train.local_epochs=-1", "config key 'train.local_epochs' is invalid", "local-epochs-negative"),
    case("train.local_steps=0", "config key 'train.local_steps' is invalid", "local-steps-zero"),
    case("dropout=1.5", "config key 'dropout' is invalid: input should be less than 1", "dropout-above-one"),
    case("dropout=1", "config key 'dropout' is invalid: input should be less than 1", "dropout-one"),
    case("train.momentum=-1", "config key 'train.momentum' is invalid", "momentum-negative"),
    case("train.momentum=1", "config key 'train.momentum' is invalid: input should be less than 1", "momentum-one"),
    case("train.weight_decay=-0.1", "config key 'train.weight_decay' is invalid", "weight-decay-negative"),
    case("train.weight_decay=.inf", "it must be a finite number (got inf)", "weight-decay-inf"),
    case("train.grad_clip=0", "config key 'train.grad_clip' is invalid", "grad-clip-zero"),
    case("train.warmup_rounds=-1", "config key 'train.warmup_rounds' is invalid", "warmup-negative"),
    case("eval_every=0", "config key 'eval_every' is invalid: input should be greater than or equal to 1",
         "eval-every-zero"),
    case("clients_per_round=0", "config key 'clients_per_round' is invalid", "clients-per-round-zero"),
    case("clients_per_round=1000", "clients_per_round=1000 exceeds the 4 clients", "clients-per-round-too-many"),
    case("min_replies=0", "config key 'min_replies' is invalid", "min-replies-zero"),
    case("threads=0", "config key 'threads' is invalid", "threads-zero"),
    case("threads=100000", "config key 'threads' is invalid: input should be less than or equal to 1024",
         "threads-huge"),
    case("workers=0", "config key 'workers' is invalid", "workers-zero"),
    case("vector_clients=0", "config key 'vector_clients' is invalid", "vector-clients-zero"),
    case("power_watts=0", "config key 'power_watts' is invalid", "power-zero"),
    case("federation.num_clients=0", "config key 'federation.num_clients' is invalid", "clients-zero"),
    case(["federation.num_clients=2", "federation.tasks={kind: one-per-client}"],
         "needs at least as many clients as tasks", "clients-fewer-than-tasks"),
    case(["method=fedprox", "method.mu=-1"], "parameter 'mu' of method 'fedprox' is invalid", "fedprox-mu-negative"),
    case(["method=fedprox", "method.mu=.inf"], "config key 'method.mu' is invalid: it must be a finite number",
         "fedprox-mu-inf"),
    case(["model.backbone=cnn", "model.hidden=0"], WIDTHS, "cnn-hidden-zero"),
    case(["model.backbone=cnn", "model.hidden=1000000000"], WIDTHS, "cnn-hidden-huge"),
    case("seed=1" + "0" * 5000, "holds a value YAML cannot convert", "seed-5000-digits"),
    # --- unknown names ---
    case("nosuchkey=1", "unknown config key 'nosuchkey'; valid keys here: imports, name, method, benchmark",
         "unknown-top-key"),
    case("train.lrr=0.1", "unknown config key 'train.lrr'; valid keys here: optimizer, lr", "unknown-train-key"),
    case("federation.clients=3", "unknown config key 'federation.clients'; valid keys here: num_clients",
         "unknown-federation-key"),
    case("method=fedsgd", "unknown method 'fedsgd'; valid choices: centralized", "unknown-method"),
    case("benchmark=cifar", "unknown benchmark 'cifar'; valid choices: cifar10, cifar100, digits-tasks",
         "unknown-benchmark"),
    case("model.backbone=nosuch", "unknown backbone 'nosuch'; valid choices: char-lstm, cnn, mlp", "unknown-backbone"),
    case("benchmark.tasks=[digit, nosuch]", "unknown digits task 'nosuch'; valid choices: digit", "unknown-task"),
    case("train.optimizer=lion", "config key 'train.optimizer' is invalid: input should be 'sgd' or 'adamw'",
         "unknown-optimizer"),
    case("train.lr_schedule=zigzag", "config key 'train.lr_schedule' is invalid", "unknown-lr-schedule"),
    case("method.plugin=nosuch", "unknown plug-in 'nosuch'; valid choices: clip, dea", "unknown-plugin"),
    case(["adversaries.attack=melt", "adversaries.fraction=0.2"], "config key 'adversaries.attack' is invalid",
         "unknown-attack"),
    case(["adversaries.attack=scale", "adversaries.clients=[99]"], "adversaries.clients names [99], but the "
         "federation has clients 0 to 3", "attacker-outside-federation"),
    case(["adversaries.attack=scale", "adversaries.fraction=2"], "config key 'adversaries.fraction' is invalid",
         "attacker-fraction-above-one"),
    case("method.nosuch=1", "unknown parameter 'nosuch' for method 'fedavg'; valid parameters:",
         "unknown-method-parameter"),
    case("benchmark.nosuch=1", "unknown parameter 'nosuch' for benchmark 'digits-tasks'",
         "unknown-benchmark-parameter"),
    case("model.nosuch=1", "unknown parameter 'nosuch' for backbone 'mlp'", "unknown-backbone-parameter"),
    case("federation.tasks.kind=nosuch", "unknown task allocation 'nosuch'", "unknown-task-allocation"),
    case("federation.samples.kind=nosuch", "unknown sample partitioner 'nosuch'", "unknown-sample-partitioner"),
    case("method.train={lrr: 0.1}", "method 'fedavg': unknown train key 'lrr'", "unknown-method-train-key"),
    case("method=" + LONG, "expected a name of 1 to 60 characters", "method-name-5000-chars"),
    case("rounds=" + LONG, "config key 'rounds' is invalid: input should be a valid integer", "rounds-5000-chars"),
    case(LONG + "=1", "unknown config key 'xxxxxxxx", "key-5000-chars"),
    # --- comparisons: members are written to --out/<label> ---
    case("method=[{name: fedavg, label: ../escaped}, local]", "method label '../escaped' cannot name a run directory",
         "label-escapes-out"),
    case("method=[{name: fedavg, label: a/b}, local]", "cannot name a run directory", "label-with-slash"),
    case("method=[fedavg, fedavg]", "method label 'fedavg' appears twice", "label-twice"),
    case("plugins=[]", "expected a non-empty list of plug-ins", "plugins-empty"),
    case(["method={name: fedprox, plugin: dea}", "plugins=[dea]"], "give plug-ins either in 'plugins' or in method "
         "entries, not both", "plugins-twice"),
    # --- broken YAML files ---
    case([], NOT_YAML + " at line 3, column 1 (expected ',' or ']'", "yaml-unclosed-bracket",
         config="name: x\nrounds: [1, 2\n"),
    case([], NOT_YAML + " at line 2, column 1 (found character '\\t' that cannot start any token)",
         "yaml-tab-indentation", config="rounds: 3\n\tseed: 1\n"),
    case([], NOT_YAML + " at line 1, column 8 (mapping values are not allowed here)", "yaml-nested-colon",
         config="name: a: b\n"),
    case([], "must hold a mapping of keys to values, not a list", "yaml-top-level-list", config="- fedavg\n- local\n"),
    case([], "must hold a mapping of keys to values, not nothing (it is empty)", "yaml-empty-file", config=""),
    case([], "must hold a mapping of keys to values, not nothing", "yaml-only-comments", config="# rounds: 3\n"),
    case([], "must hold a mapping of keys to values, not a single value", "yaml-scalar", config="42\n"),
    case([], "gives the key 'rounds' twice (again on line", "yaml-duplicate-key", config=small_yaml() + "rounds: 9\n"),
    case([], "could not determine a constructor for the tag", "yaml-python-tag",
         config="name: !!python/object/apply:os.system [echo hi]\n"),
    case([], "nests collections more than 64 levels deep", "yaml-deep-nesting", config="a: " + "[" * 50_000),
    case([], "has an alias inside the collection it names", "yaml-recursive-alias", config="a: &a [1, *a]\n"),
    case([], "has the key 1, which is not text", "yaml-integer-key", config=small_yaml() + "1: 2\n"),
    case([], "has the key None, which is not text", "yaml-null-key", config=small_yaml() + "~: 2\n"),
    case([], "config key 'method' has the key 1, which is not text", "yaml-integer-key-in-method",
         config=small_yaml(method={"name": "fedavg", 1: 2})),
    case([], "is larger than 1 MiB, the limit for a config file", "config-over-1mib",
         config=small_yaml() + "#" * (1 << 20) + "\n"),
    case([], "is not YAML text (it holds the control character #x07)", "config-control-character",
         config="name: a\x07b\n"),
    case([], "the config is missing the required key 'method'", "config-without-method", config="rounds: 3\n"),
    # --- unusable paths ---
    case([], "does not exist", "config-missing", config=MISSING),
    case([], "is a directory; give a YAML file", "config-is-a-directory", config=DIRECTORY),
    case([], "cannot create the run directory", "out-inside-a-file", out="a-file/out"),
    case([], "unexpected argument 'second.yaml'", "two-config-files", extra=["second.yaml"]),
    # --- bad overrides ---
    case("=5", "override '=5' is not of the form key=value", "override-without-key"),
    case("train..lr=1", "override 'train..lr=1' has an empty part in its key", "override-empty-segment"),
    case("train.=1", "has an empty part in its key", "override-trailing-dot"),
    case(".lr=1", "has an empty part in its key", "override-leading-dot"),
    case(".".join("k" * 20) + "=1", "has a key of more than 16 parts", "override-deep-key"),
    case("rounds=[1,", "the value of override 'rounds=[1,' is not valid YAML", "override-malformed-list"),
    case("name={a: ", "the value of override 'name={a: ' is not valid YAML", "override-malformed-mapping"),
    case("rounds.x=1", "cannot set 'rounds.x': 'rounds' is not a mapping in the config", "override-into-a-number"),
    case("model.hidden=" + FLOW_LAUGHS, "expands to more than 100,000 values", "override-billion-laughs"),
    # printed as text, not as Rich markup; clipped where the registry quotes a value; an --out name too long
    pytest.param(Case(['rounds="[/]"'], "config key 'rounds' is invalid"), id="rich-markup-in-echoed-input"),
    pytest.param(Case(["method=fedprox", "method.mu=" + LONG], "parameter 'mu' of method 'fedprox' is invalid"),
                 id="registry-echoes-unbounded-parameter"),
    pytest.param(Case([], "cannot be used (File name too long); choose another --out", out="z" * 300),
                 id="out-name-too-long"),
]


@pytest.mark.parametrize("bad", CASES)
def test_bad_input_is_one_sentence_exit_2_and_writes_nothing(tmp_path, monkeypatch, bad):
    _check_refused(tmp_path, monkeypatch, bad)




def _check_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: Case) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "a-file").write_text("keep me\n")
    config = work / "config.yaml"
    if bad.config is None:
        config.write_text(small_yaml())
    elif isinstance(bad.config, bytes):
        config.write_bytes(bad.config)
    elif isinstance(bad.config, str):
        config.write_text(bad.config)
    elif bad.config is DIRECTORY:
        config = work / "a-directory"
        config.mkdir()
    elif bad.config is MISSING:
        config = work / "nope.yaml"
    out = Path(bad.out) if bad.out.startswith("/") else work / bad.out
    monkeypatch.chdir(work)  # a stray default run directory (runs/...) would land here
    before = sorted(str(p.relative_to(work)) for p in work.rglob("*"))

    result = runner.invoke(app, ["run", str(config), *bad.args, *bad.extra, "--out", str(out), "--quiet"])

    output = result.output
    assert result.exit_code == 2, output[-2000:]
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output[-2000:]
    line = lines[0]
    assert line.startswith("error: "), line
    # the input echoed clipped (an unknown key's line then lists the valid keys, as many as the config has)
    assert len(line.split("; valid keys here: ")[0]) < 450, line[:600]
    assert bad.expected in line, line
    after = sorted(str(p.relative_to(work)) for p in work.rglob("*"))
    assert after == before, "the run wrote files"
    assert (work / "a-file").read_text() == "keep me\n"
    if bad.out == "a-file":
        assert out.is_file()
    else:
        assert not os.path.exists(out)  # False, not an error, for a name the file system refuses

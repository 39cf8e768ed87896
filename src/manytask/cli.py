"""The `manytask` command line: run | tune | list | report | compare | cross-eval | experiments | reproduce."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Literal, TypeVar, get_args

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from manytask.errors import ManytaskError
from manytask.extras import require

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False, help="Federated many-task learning.")
# Piped output (CI, files) gets a wide console so comparison tables are not squeezed into 80 columns.
out_console = Console() if sys.stdout.isatty() else Console(width=200)
err_console = Console(stderr=True)
R = TypeVar("R")
TableFormat = Literal["md", "csv", "latex", "json"]  # manytask compare --format


TERMINAL_TASK_COLUMNS = 12  # beyond this (one task per client, say) the terminal table shows averages only
RESUME_HINT = "interrupted; the last finished round is checkpointed (continue with --resume DIR)."
SIGINT_AFTER_ROUND = "MANYTASK_SIGINT_AFTER_ROUND"  # testing hook: Ctrl-C this run right after that round


def _guarded(action: Callable[[], R], interrupted: str = "interrupted.") -> R:
    """Run a command body; user errors become one line on stderr and exit code 2, without a traceback."""
    try:
        return action()
    except ManytaskError as err:
        err_console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        err_console.print(interrupted)
        raise typer.Exit(130) from None


def _split_args(args: list[str]) -> tuple[str | None, list[str]]:
    """The optional CONFIG path (first argument without '=') and the key=value overrides."""
    config = None
    overrides = []
    for arg in args:
        if "=" in arg:
            overrides.append(arg)
        elif config is None:
            config = arg
        else:
            raise ManytaskError(f"unexpected argument '{arg}'; give one CONFIG file, then key=value overrides.")
    return config, overrides


@app.command()
def run(
    args: Annotated[list[str] | None, typer.Argument(help="[CONFIG.yaml] [key=value ...]")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="run directory (default: runs/NAME-TIME)")] = None,
    resume: Annotated[Path | None, typer.Option(
        "--resume", help="continue the stopped run in DIR (placement keys only may follow: device=cpu, workers=2)")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bars")] = False,
    sweep: Annotated[list[str] | None, typer.Option(
        "--sweep", help="KEY=V1,V2: run every member once per value (repeatable: the grid of every --sweep)")] = None,
) -> None:
    """Run a config (the built-in default many-task comparison when none is given)."""
    from manytask.config import resolve
    from manytask.engine.loop import RoundFailed
    from manytask.launch import resume as resume_run
    from manytask.launch import run_config, stopped_runs
    from manytask.progress import RichObserver, SignalAfterRound, run_header
    from manytask.report import write_report

    def body() -> None:
        if resume is not None:
            config_path, placement = _split_args(args or [])
            if config_path or sweep:
                raise ManytaskError("--resume takes the run directory and placement keys (device=cpu) only; its "
                                    "config.yaml is reused as it is.")
            target, header = resume, None
            start = lambda observer: resume_run(resume, observer, placement=placement)  # noqa: E731
        else:
            config_path, overrides = _split_args(args or [])
            config = resolve(config_path, overrides, sweep)
            target = out or Path("runs") / f"{config.name}-{datetime.now():%Y%m%d-%H%M%S}"
            start = lambda observer: run_config(config, target, observer)  # noqa: E731
            header = run_header(config)
        interrupt = os.environ.get(SIGINT_AFTER_ROUND)

        def observed(observer: RichObserver | None) -> None:
            start(observer if interrupt is None else SignalAfterRound(int(interrupt), observer))

        try:
            if quiet:
                observed(None)
            else:
                with RichObserver(err_console, header) as observer:
                    observed(observer)
        except RoundFailed as err:  # other errors (a refused checkpoint, say) leave the directory as it is
            stopped = stopped_runs(target)
            if not stopped:
                raise
            whole = [target] if target not in stopped and (target / "summary.json").is_file() else []
            reports = ", ".join(str(write_report(run_dir)) for run_dir in [*whole, *stopped])
            raise ManytaskError(f"{err} The summary and report of the rounds that completed: {reports}") from None
        report = write_report(target)
        _print_comparison([target])
        out_console.print(f"run directory: {target}\nreport: {report}")

    _guarded(body, RESUME_HINT)


@app.command()
def tune(
    args: Annotated[list[str] | None, typer.Argument(help="[CONFIG.yaml] [key=value ...]")] = None,
    trials: Annotated[int | None, typer.Option("--trials", min=1, help="trials per member (default: tune.trials)")]
    = None,
    out: Annotated[Path | None, typer.Option("--out", help="tuning directory (default: runs/NAME-tune-TIME)")] = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="continue the tuning in DIR")] = None,
) -> None:
    """Tune every member of a config with the same number of Optuna trials, scored on a validation split of the
    training data; writes DIR/tuned.yaml for manytask run."""
    from manytask.config import resolve, validate
    from manytask.config_sources import load_yaml
    from manytask.tune import tune as run_tuning

    def body() -> None:
        if resume is not None:
            if args or trials is not None:
                raise ManytaskError("--resume takes the tuning directory only; its config.yaml is reused as it is.")
            config, target = validate(load_yaml(resume / "config.yaml")), resume
        else:
            config_path, overrides = _split_args(args or [])
            config = resolve(config_path, [*overrides, *([f"tune.trials={trials}"] if trials else [])])
            target = out or Path("runs") / f"{config.name}-tune-{datetime.now():%Y%m%d-%H%M%S}"
        tuned = run_tuning(config, target, progress=lambda line: out_console.print(line, highlight=False))
        out_console.print(f"tuned config: {tuned}\nrun it over the seeds with: manytask run {tuned}")

    _guarded(body, "interrupted; the finished trials are in the study (continue with manytask tune --resume DIR).")


@app.command()
def bench(
    out: Annotated[Path, typer.Option("--out", help="where the figures go as JSON")] = Path("bench.json"),
    rounds: Annotated[int, typer.Option("--rounds", min=1, help="timed rounds per measurement")] = 5,
    flower: Annotated[bool, typer.Option("--flower/--no-flower", help="also time Flower's simulation")] = True,
    matu_d: Annotated[int, typer.Option("--matu-d", min=1, help="entries of MaTU's unified vector")] = 10_000_000,
    sfmtl_clients: Annotated[int, typer.Option("--sfmtl-clients", min=2, help="SFMTL-Graph's participants")] = 1000,
    only: Annotated[list[str] | None, typer.Option(
        "--only", help="measure only this part (repeatable): kernels, limit, members, paper, scale, engine, workers, "
        "memory, matu, sfmtl, flower (paper, SFMTL's members at the paper's scale, and scale, FedAvg + DEA on a "
        "Swin-T, FL + TaLoS and MAS-2 at scale, are for a GPU and run only when named)")] = None,
    kernels: Annotated[bool, typer.Option("--kernels", help="only the kernels per round (--only kernels)")] = False,
) -> None:
    """Measure the speed ratios on this machine, side by side (docs/performance.md): kernels per training round at
    32 clients against 4 for the hosts and the personalized methods, under execution auto; every member of the SFMTL
    comparison against the batched compute limit (and, with --only paper, at the paper's scale against a bare loop);
    the local engine, sequential
    and vectorized, against a bare PyTorch loop doing the same SGD steps, at 30 and 100 clients; two worker processes
    against one; peak memory at 1 000 and 10 000 clients; MaTU's and SFMTL-Graph's server steps; Flower's simulation
    against the local engine (when Flower is installed)."""
    from manytask.bench.harness import DEFAULT_PARTS, run_bench
    from manytask.bench.tables import tables
    from manytask.report import rich_table

    def body() -> None:
        parts = ["kernels"] if kernels else only or DEFAULT_PARTS
        results = run_bench(out, rounds, flower, matu_d, sfmtl_clients, parts)
        for headers, rows, title in tables(results):
            out_console.print(rich_table(headers, rows, title))
        out_console.print(f"machine: {results['machine']['processor']}, {results['machine']['platform']}; "
                          f"figures: {out}")

    _guarded(body)


@app.command()
def pretrain(
    args: Annotated[list[str] | None, typer.Argument(help="[CONFIG.yaml] [key=value ...]")] = None,
) -> None:
    """Pretrain (or find in the cache) the backbone a config asks for with model.pretrained: true."""
    from manytask.config import resolve
    from manytask.experiment import ModelConfig, make_benchmark

    def body() -> None:
        config = resolve(*_split_args(args or []))
        model = ModelConfig(**{**config.model, "pretrained": True})
        pretrained = model.pretrained_weights(make_benchmark(config), config.seed)
        out_console.print(f"{pretrained.description}\nweights: {pretrained.path}", highlight=False)

    _guarded(body)


@app.command("export-partitions")
def export_partitions(
    args: Annotated[list[str], typer.Argument(help="CONFIG.yaml DIR [key=value ...]")],
) -> None:
    """Write each client's partition to DIR/client-<k> and the test sets to DIR/server, for a deployment whose
    SuperNodes read only their own data (`--node-config "partition-id=k data-path=DIR/client-k"`); DIR/config.yaml
    is the config to deploy."""
    from manytask.benchmarks.exported import export_partitions as export
    from manytask.config import resolve
    from manytask.experiment import Experiment

    def body() -> None:
        paths = [a for a in args if "=" not in a]
        if len(paths) != 2:
            raise ManytaskError("export-partitions takes CONFIG.yaml and DIR, then key=value overrides.")
        config = resolve(paths[0], [a for a in args if "=" in a])
        if config.is_comparison:
            raise ManytaskError("export-partitions takes a single-method config (a deployment runs one method).")
        deployed = export(Experiment.build(config), Path(paths[1]))
        out_console.print(f"partitions: {paths[1]}/client-<k> (one per SuperNode), test sets: {paths[1]}/server\n"
                          f"config to deploy: {deployed}")

    _guarded(body)


@app.command("list")
def list_choices() -> None:
    """Methods (by family), plug-ins and the hosts they wrap, benchmarks, partitioners and backbones."""
    from manytask.benchmarks import BENCHMARKS
    from manytask.federation import SAMPLE_PARTITIONERS, TASK_ALLOCATIONS
    from manytask.methods import METHODS, PLUGINS
    from manytask.models import BACKBONES
    from manytask.registry import describe_params

    methods = [(e.name, e.target.family, describe_params(e.params), e.description) for e in METHODS.entries()]
    methods.sort(key=lambda row: row[1])
    _print_choices("methods (method=NAME)", ("name", "family", "parameters", "description"), methods)
    plugins = [(e.name, describe_params(e.params), ", ".join(e.target.hosts()), e.description)
               for e in PLUGINS.entries()]
    _print_choices("plug-ins (method.plugin=NAME)", ("name", "parameters", "wraps", "description"), plugins)
    sections = [
        ("benchmarks (benchmark=NAME)", BENCHMARKS),
        ("task allocations (federation.tasks.kind=NAME)", TASK_ALLOCATIONS),
        ("sample partitioners (federation.samples.kind=NAME)", SAMPLE_PARTITIONERS),
        ("backbones (model.backbone=NAME)", BACKBONES),
    ]
    for title, registry in sections:
        rows = [(e.name, describe_params(e.params), e.description) for e in registry.entries()]
        _print_choices(title, ("name", "parameters", "description"), rows)


def _print_choices(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    table = Table(title=title, title_justify="left", show_lines=False)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    out_console.print(table)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="a run directory")],
    graph_round: Annotated[
        list[int] | None,
        typer.Option("--graph-round", help="a round to draw the client graph at (repeatable; default: first, "
                     "middle and last round with communities)"),
    ] = None,
    base: Annotated[
        str | None,
        typer.Option("--base", help="a run directory, or a member's label in a comparison: report Δ% against it"),
    ] = None,
) -> None:
    """Write RUN_DIR/report.md and its plots from the run directory alone."""
    from manytask.report import write_report

    _guarded(lambda: out_console.print(f"report: {write_report(run_dir, graph_round, base)}"))


@app.command()
def compare(
    run_dirs: Annotated[list[Path], typer.Argument(help="run directories")],
    base: Annotated[
        str | None,
        typer.Option("--base", help="a run directory, or the label of a compared run: add each run's Δ% against it"),
    ] = None,
    table_format: Annotated[TableFormat | None, typer.Option(
        "--format", help="the comparison table with every column as Markdown, CSV (numbers), LaTeX or JSON "
        "(numbers) instead of the terminal's tables")] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", help="write the table to FILE (--format, else the format its suffix names: .md .csv .tex "
        ".json)")] = None,
) -> None:
    """One table across runs (comparison directories expand into their members)."""
    from manytask.report import load_runs
    from manytask.report.tables import comparison_text

    def body() -> None:
        chosen = table_format or (None if output is None else _format_of(output))
        if chosen is None:
            _print_comparison(run_dirs, base)
            return
        if base is not None:
            raise ManytaskError("--base adds Δ% tables to the terminal's view only; leave it out with --format.")
        text = comparison_text(load_runs(run_dirs), chosen)
        if output is None:
            typer.echo(text, nl=False)
            return
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as err:
            raise ManytaskError(f"cannot write the table to '{output}': {err.strerror or err}.") from None
        out_console.print(f"table: {output}", highlight=False)

    _guarded(body)


FORMAT_OF_SUFFIX: dict[str, TableFormat] = {".md": "md", ".csv": "csv", ".tex": "latex", ".json": "json"}


def _format_of(output: Path) -> TableFormat:
    """The table format an --output file's suffix names."""
    if output.suffix not in FORMAT_OF_SUFFIX:
        raise ManytaskError(f"cannot tell the table format of '{output}' from its suffix; give --format "
                            f"({', '.join(get_args(TableFormat))}).")
    return FORMAT_OF_SUFFIX[output.suffix]


@app.command("cross-eval")
def cross_eval(run_dirs: Annotated[list[Path], typer.Argument(help="finished run directories (comparisons expand)")]
               ) -> None:
    """The cross-evaluation oracle of personalized runs: every client's final model on every client's test data,
    its communities and their ARI against the true clusters (written to each run's cross_evaluation.json)."""
    from manytask.cross_eval import oracle
    from manytask.report.runs import comparison_order, is_comparison

    def body() -> None:
        for path in run_dirs:
            members = [path / name for name in comparison_order(path)] if is_comparison(path) else [path]
            for member in members:
                found = oracle(member)
                ari = "no true clusters" if found["ari"] is None else f"ARI {found['ari']:.2f}"
                out_console.print(f"{member}: {len(found['communities'])} oracle communities, {ari}; own data "
                                  f"{found['own']:.3f}, others' {found['others']:.3f}", highlight=False)

    _guarded(body)


@app.command()
def experiments(
    ids: Annotated[list[str] | None, typer.Argument(help="experiment ids or paper keys (default: all)")] = None,
) -> None:
    """Every table and figure of the five papers: its id, what it shows, the paper's numbers and its scales."""
    from manytask.experiments.listing import listing

    _guarded(lambda: out_console.print(listing(ids or []), highlight=False, soft_wrap=True, markup=False))


@app.command()
def reproduce(
    target: Annotated[str, typer.Argument(help="an experiment id, or: render | check")],
    ids: Annotated[list[str] | None, typer.Argument(help="check: the experiments or papers to check (default: all)")]
    = None,
    scale: Annotated[str, typer.Option("--scale", help="smoke | cpu | paper")] = "cpu",
    seeds: Annotated[str | None, typer.Option("--seeds", help="seeds, comma-separated (default: the scale's)")] = None,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="runs at a time, one torch thread each")] = 1,
    out: Annotated[Path | None, typer.Option("--out", help="run directories (default: runs/reproduce/ID/SCALE)")]
    = None,
    mark: Annotated[bool, typer.Option("--mark", help="check: record stale tables in results/stale.json")] = False,
) -> None:
    """Run one of the papers' experiments (`manytask experiments` lists them) and write results/ID/SCALE.json;
    `render` generates docs/results.md and the method pages' tables from the result files; `check` reruns every
    smoke experiment and lists the tables whose fingerprint moved."""
    from manytask.experiments import commands

    def body() -> None:
        say = lambda line: out_console.print(line, highlight=False, soft_wrap=True, markup=False)  # noqa: E731
        if target == "render":
            commands.render_pages(say)
        elif target == "check":
            if not commands.check_tables(ids or [], jobs, mark, say):
                raise typer.Exit(1)
        else:
            if ids:
                raise ManytaskError(f"unexpected argument '{ids[0]}'; reproduce runs one experiment at a time.")
            chosen = None if seeds is None else tuple(int(s) for s in seeds.split(","))
            commands.reproduce_one(target, scale, chosen, jobs, out, say)

    _guarded(body, "interrupted; finished runs are kept: the same command goes on from them.")


flower_app = typer.Typer(help="Flower deployment helpers (needs manytask[flower]).")
app.add_typer(flower_app, name="flower")


@flower_app.command("local-cluster")
def local_cluster(
    nodes: Annotated[int, typer.Option("--nodes", help="number of SuperNodes (= num_clients of the run)")] = 3,
    port: Annotated[int | None, typer.Option("--port", help="SuperLink port (default: a free one)")] = None,
    workdir: Annotated[Path, typer.Option("--workdir", help="logs and Flower state")] = Path("runs/flower-cluster"),
    tls_dir: Annotated[
        Path | None, typer.Option("--tls-dir", help="directory with ca.crt, server.pem, server.key: run with TLS")
    ] = None,
    partitions: Annotated[
        Path | None, typer.Option("--partitions", help="an export-partitions DIR: SuperNode k reads DIR/client-k")
    ] = None,
    states: Annotated[Path | None, typer.Option(
        "--states", help="SuperNode k saves its client states in DIR/supernode-k: deployed runs of stateful methods "
        "resume exactly")] = None,
    auth: Annotated[bool, typer.Option(
        "--auth", help="SuperNode authentication: each node's key is made and registered, any other node is "
        "refused (TLS: --tls-dir, or loopback certificates made in WORKDIR/certs)")] = False,
    database: Annotated[Path | None, typer.Option(
        "--database", help="the SuperLink keeps its state in this SQLite file: started again after a crash, it "
        "knows its runs and nodes (default: in memory)")] = None,
) -> None:
    """Start a SuperLink and N SuperNodes on 127.0.0.1, print how to run against them, say when a SuperNode exits
    (and clean up after it), stop them on Ctrl-C."""

    def body() -> None:
        import signal
        import time

        require("flwr", "manytask flower local-cluster")
        from manytask.engine.flower.cluster import LocalCluster
        from manytask.engine.flower.credentials import TLSFiles, write_loopback_certificates

        # SIGTERM (and SIGINT, even where a shell started us with it ignored) stops the cluster cleanly.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.default_int_handler)

        tls = None if tls_dir is None else TLSFiles(tls_dir / "ca.crt", tls_dir / "server.pem", tls_dir / "server.key")
        if auth and tls is None:
            tls = write_loopback_certificates(workdir / "certs")
        data = None if partitions is None else [partitions / f"client-{k}" for k in range(nodes)]
        with LocalCluster(nodes, workdir, tls, port, data, auth=auth, state_root=states,
                          database=database) as cluster:
            certs = "" if tls is None else f" flower.root_certificates={tls.ca_cert}"
            keys = (f"Only the {nodes} SuperNodes whose keys are in {workdir / 'keys'} may join.\n" if auth else "")
            out_console.print(
                f"SuperLink on {cluster.address} with {nodes} SuperNodes (logs in {workdir}).\n{keys}"
                f"Run against it:  manytask run CONFIG engine=flower federation.num_clients={nodes} "
                f"flower.superlink={cluster.address}{certs}\nCtrl-C stops the cluster.",
                highlight=False,
            )
            try:
                while True:
                    time.sleep(1)
                    for index in cluster.dead_nodes():  # reaped there: no stray ClientApps left behind
                        out_console.print(f"{escape(cluster.describe_exit(index))}; the run goes on without it.",
                                          highlight=False, soft_wrap=True)
            except KeyboardInterrupt:
                out_console.print("stopping the cluster...")
        out_console.print("cluster stopped.")

    _guarded(body, "interrupted while starting or stopping the cluster; its daemons were signalled to stop.")


def _print_comparison(run_dirs: list[Path], base: str | None = None) -> None:
    from manytask.report import comparison_rows, load_runs, rich_table
    from manytask.report.delta import delta_table, resolve_base
    from manytask.report.plugins import plugin_table
    from manytask.report.seeds import NOISE_NOTE, seed_table
    from manytask.report.tables import energy_footnote, fit_columns

    def show(headers: list[str], rows: list[list[str]], title: str, caption: str | None = None) -> None:
        """A table with the columns the terminal's width holds; a caption says what report.md adds (the energy
        note goes with the energy column)."""
        shown, kept, left_out = fit_columns(headers, rows, out_console.width)
        if "energy" in headers and "energy" not in shown:
            caption = None
        if left_out:
            note = f"{left_out} of {len(headers)} columns left out for this terminal's width; report.md has them all"
            caption = note if caption is None else f"{caption}\n{note}"
        out_console.print(rich_table(shown, kept, title, caption=caption))

    records = load_runs(run_dirs)
    seeds = seed_table(records, base, max_task_columns=TERMINAL_TASK_COLUMNS)
    if seeds is not None:
        show(*seeds, "over seeds", caption=NOISE_NOTE)
        base = None  # Δ% against the base is in the seeds' table, seed by seed
    reference = None if base is None else resolve_base(records, base)
    headers, rows = comparison_rows(records, max_task_columns=TERMINAL_TASK_COLUMNS)
    show(headers, rows, "comparison", caption=energy_footnote(records))
    plugins = plugin_table(records)
    if plugins is not None:
        show(*plugins, "plug-ins against their hosts (Δ%)")
    if reference is not None:
        show(*delta_table(records, reference), f"Δ% against {reference.label}")


def main() -> None:
    app(prog_name="manytask")


if __name__ == "__main__":
    sys.exit(main())

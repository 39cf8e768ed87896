"""The papers' published tables, as data: one tab-separated file per table (`<paper>_<table>.tsv`), a `#` line
saying where it comes from, a header naming the columns (the first is the row's label) and one row per line, `-`
where the paper gives no figure."""

from __future__ import annotations

from importlib import resources

from manytask.experiments.spec import Value


def published(name: str) -> dict[str, dict[str, Value]]:
    """The rows of the published table `name` (`feddea_table3_nyud`): label -> {column: figure}."""
    return parse_table(resources.files(__name__).joinpath(f"{name}.tsv").read_text(encoding="utf-8"), name)


def parse_table(text: str, name: str) -> dict[str, dict[str, Value]]:
    """A published table's text as rows (`name` says which table a malformed row is in)."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    _, *columns = lines[0].split("\t")
    rows: dict[str, dict[str, Value]] = {}
    for line in lines[1:]:
        label, *values = line.split("\t")
        if len(values) != len(columns):
            raise ValueError(f"{name}.tsv: row '{label}' has {len(values)} figures for {len(columns)} columns")
        rows[label] = {column: float(value) for column, value in zip(columns, values, strict=True) if value != "-"}
    return rows


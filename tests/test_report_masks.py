"""The mask-location plot (FL + TaLoS paper's Fig. 4): fractions by block and parameter, and its place in reports."""

import math

from manytask.config import validate
from manytask.launch import run_config
from manytask.report import write_report
from manytask.report.masks import block_grid
from tests.conftest import small_config_dict
from tests.test_talos_methods import TALOS


def test_block_grid_puts_each_parameter_in_its_block_row_and_its_own_column():
    vit = "backbone.model.layers"
    rows, columns, grid = block_grid({
        f"{vit}.0.attention.q_proj.weight": 0.1, f"{vit}.0.mlp.fc1.bias": 0.2,
        f"{vit}.1.attention.q_proj.weight": 0.3, "backbone.proj.weight": 0.4,
    })
    assert rows == ["block 0", "block 1", "other"]
    assert columns == ["attn.q_proj.w", "fc1.b", "backbone.proj.w"]
    assert grid[0].tolist()[:2] == [0.1, 0.2] and grid[1, 0] == 0.3 and grid[2, 2] == 0.4
    assert math.isnan(grid[1, 1]) and math.isnan(grid[0, 2])


def test_a_comparison_report_shows_where_each_talos_runs_mask_lands(tmp_path):
    methods = [{"name": "talos", **TALOS}, {"name": "talos-partition", **TALOS}, "head-only"]
    run_config(validate(small_config_dict(method=methods, rounds=4)), tmp_path / "c")
    text = write_report(tmp_path / "c").read_text()
    for label in ("talos", "talos-partition"):
        assert f"Where the mask lands: fraction trainable per block and parameter ({label})" in text
        assert (tmp_path / "c" / "plots" / f"mask_location_{label}.png").stat().st_size > 5000
    assert "mask_location_head-only" not in text

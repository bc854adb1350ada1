"""The evaluation on a small grid measured here, for real: two loop devices, three workloads,
four configurations, two repeats. Each cell is held out, the search recommends with canaries,
regrets are against the grid's own oracle, and the fixed rules are judged the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.contract.tunables import DeviceConfig, Scheduler
from bench.grid.host import measure_host_grid
from models import evaluate
from models.distributed import ray_map, ray_session
from models.features import config_key
from models.grid import Grid
from models.priors import Objective
from tests.agent.conftest import LoopFactory
from tests.models.runs import STOCK_DEFAULTS, WORKLOADS
from tests.proc import clean_env
from tests.proc import run as run_cli

CONFIGS = list(STOCK_DEFAULTS.values())


def test_regret_is_relative_to_the_best_in_the_metrics_direction() -> None:
    assert evaluate.regret(110.0, 100.0, higher_is_better=False) == pytest.approx(0.10)
    assert evaluate.regret(90.0, 100.0, higher_is_better=True) == pytest.approx(0.10)
    assert evaluate.regret(100.0, 100.0, higher_is_better=False) == 0.0


@pytest.mark.timeout(1500)  # 48 fio runs and a Ray session: 600 s was passed on a busy host
def test_held_out_cells_with_canaries_and_baselines(
    loop_device: LoopFactory, tmp_path: Path
) -> None:
    devices = {
        "tmpfs": (loop_device(on="tmpfs", size_mb=64), "loop on tmpfs"),
        "disk": (loop_device(on="disk", size_mb=64), "loop on disk"),
    }
    grid = measure_host_grid(
        devices, WORKLOADS, repeats=2, work=tmp_path, configs=lambda device: CONFIGS
    )
    assert len(grid.runs) == 2 * 3 * 4 * 2
    assert grid.devices["tmpfs"].default == DeviceConfig(scheduler=Scheduler.NONE)
    grid.save(tmp_path / "grid.json")
    again = Grid.load(tmp_path / "grid.json")
    assert again.to_json() == grid.to_json()

    reports = evaluate.evaluate(grid, [Objective.P50], max_canaries=2)
    report = reports[Objective.P50.value]
    assert len(report.cells) == 6
    for cell in report.cells:
        truth = grid.truth(cell.device, cell.workload, Objective.P50)
        assert set(truth) == {config_key(c) for c in CONFIGS}
        assert cell.oracle_value == min(truth.values())
        assert len(cell.canaries) <= 2
        assert len(cell.regrets) == len(cell.canaries) + 1
        assert cell.regrets[-1] == evaluate.regret(
            truth[cell.chosen[-1]], cell.oracle_value, higher_is_better=False
        )
        none = truth["none[]/interrupt"]
        assert cell.baselines["always-none"] == pytest.approx(none / cell.oracle_value - 1)
        # the kernel gives a new loop device none
        assert cell.baselines["kernel-default"] == cell.baselines["always-none"]
        # every canary measures a configuration the cell had not seen, never the one it runs
        assert len(set(cell.canaries)) == len(cell.canaries)
        assert "none[]/interrupt" not in cell.canaries
    summary = report.summary()
    assert summary["cells"] == 6
    assert set(summary["baselines"]) == {
        "always-none",
        "kernel-default",
        "udev-rotational-rule",
        evaluate.FIXED_RULE,
    }
    assert summary["max_canaries"] <= 2
    assert summary["median_regret"] >= 0

    # the same evaluation with the cells as Ray tasks gives the same answers
    with ray_session(num_cpus=2):
        on_ray = evaluate.evaluate(grid, [Objective.P50], max_canaries=2, mapper=ray_map)
    assert [c.chosen for c in on_ray["p50_latency"].cells] == [c.chosen for c in report.cells]

    # the command does the same from the stored grid
    done = run_cli(
        "eval",
        "--grid",
        str(tmp_path / "grid.json"),
        "--objective",
        "p50_latency",
        "--max-canaries",
        "2",
        "--local",
        "--output",
        str(tmp_path / "cells.json"),
        env=clean_env(tmp_path),
        timeout=600,
    )
    summary_cli = json.loads(done.stdout)["p50_latency"]
    assert done.returncode == (0 if summary_cli["beats_every_baseline"] else 1), done.stderr
    assert summary_cli["median_regret"] == summary["median_regret"]
    cells = json.loads((tmp_path / "cells.json").read_text())["p50_latency"]["cells"]
    assert [c["chosen"] for c in cells] == [c.chosen for c in report.cells]

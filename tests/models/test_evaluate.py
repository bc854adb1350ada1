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


def _cell(seed: int, pick: float, default: float, rule: float) -> evaluate.CellResult:
    return evaluate.CellResult(
        device="d", workload="w", objective="p99_latency", oracle="none", oracle_value=1.0,
        chosen=["none"], regrets=[pick], canaries=[], model_regrets=[pick], seed=seed,
        baselines={evaluate.KERNEL_DEFAULT: default, evaluate.FIXED_RULE: rule, "always-none": 0.5},
    )  # fmt: skip


def test_a_pick_is_judged_on_every_seed_not_on_the_mean_over_seeds() -> None:
    """Issue 66's case: a mean over three seeds (74.0, 163.9, 144.5 → 127.5 %) beat the class
    rule's 127.8 %, while two seeds of three were worse than it, one worse than the kernel
    default too. Each seed is judged on its own and the pick is not trusted."""
    report = evaluate.Report(
        "p99_latency",
        [
            _cell(0, 0.740, 1.569, 1.278),
            _cell(1, 1.639, 1.569, 1.278),
            _cell(2, 1.445, 1.569, 1.278),
        ],
    )
    found = report.by_seed()
    assert [row["worse_than"] for row in found["per_seed"]] == [
        [],
        [evaluate.KERNEL_DEFAULT, evaluate.FIXED_RULE],
        [evaluate.FIXED_RULE],
    ]
    assert found["every_seed_no_worse"] is False
    assert report.summary()["every_seed_no_worse"] is False
    steady = evaluate.Report("p99_latency", [_cell(s, 0.7, 1.5, 1.2) for s in range(3)])
    assert steady.by_seed()["every_seed_no_worse"] is True


def test_the_learning_curve_hides_all_class_mates_but_the_step() -> None:
    """The learning curve's step k trains on k of the held-out device's class-mates (drawn by
    the seed) and on every device of other classes: the other class-mates' cells are hidden,
    none of another class's."""
    from bench.policy_eval import GRID

    grid = Grid.load_all([GRID])
    device = next(d for d in sorted(grid.devices) if evaluate.same_class_others(grid, d))
    mates = evaluate.same_class_others(grid, device)

    def hidden_devices(keep: int) -> set[str]:
        return {cell[0] for cell in evaluate.same_class_hidden(grid, device, keep, 0)}

    assert hidden_devices(0) == set(mates)
    assert hidden_devices(len(mates)) == set()
    kind = grid.devices[device].row.get("device_class")
    assert all(grid.devices[d].row.get("device_class") == kind for d in hidden_devices(0))


def test_skill_is_cross_validated_on_devices_the_model_never_saw() -> None:
    """A recommendation before its first canary is for a device the model has not measured:
    its skill (R²) comes from held-out devices — every cell of a device out of training
    together — where there are at least as many devices as folds."""
    from bench.policy_eval import GRID
    from models.training import cross_validate

    grid = Grid.load_all([GRID])
    samples = grid.samples(exclude=[])
    scores = cross_validate(samples, Objective.P50)
    assert len(grid.devices) >= 3
    assert scores["held_out"] == "devices"
    assert scores["folds"] == 3
    one = [s for s in samples if str(s.device_id) == str(grid.devices[sorted(grid.devices)[0]].id)]
    assert cross_validate(one, Objective.P50)["held_out"] == "cells"

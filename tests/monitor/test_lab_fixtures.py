"""Recorded lab runs as fixtures: export from a lab directory, the format, the committed fixtures and
their score per source in the evaluation."""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from contracts import metrics as M
from lldmon_lab.evaluation import SOURCE_LAB, evaluate, render
from lldmon_lab.lab.fixtures import (
    FORMAT,
    FixtureError,
    export_lab,
    label_of,
    load_fixtures,
    main,
    read_fixture,
    write_csv,
    write_fixture,
)
from lldmon_lab.lab.results import TASK_SUCCESS
from lldmon_lab.labels import DAMAGED, RULE, collapse_step, outcome
from monitor.cli import app

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "tests" / "fixtures" / "lab"
runner = CliRunner()


def _record(key: str, status: str = "finished") -> dict[str, Any]:
    return {
        "key": key,
        "group": "g",
        "seed": 3,
        "setting": {"model": "tiny", "lr": 0.001, "steps": 40},
        "run_name": key,
        "status": status,
        "command": f"python examples/search_r1_grpo.py --seed 3 --run-name {key}",
        "run": {"phase": "healthy", "last_step": 40},
        "reward": {"steps": [], "values": []},
        "alerts": [{"kind": "garbled_outputs", "severity": "critical", "first_step": 30, "last_step": 35}],
        "phases": [],
        "directives": [],
    }


def _lab(tmp_path: Path) -> tuple[Path, dict[int, float]]:
    """A lab directory with one finished collapsing run (reward every 2nd step), one failed run."""
    lab = tmp_path / "lab"
    (lab / "runs").mkdir(parents=True)
    rewards = {s: (0.4 if s < 16 else 0.0) for s in range(1, 41, 2)}
    lines = []
    for s in range(1, 41):
        metrics: dict[str, Any] = {M.GRAD_NORM: 0.5 + s / 100, M.LOSS: 0.01}
        if s in rewards:
            metrics[M.REWARD_MEAN] = rewards[s]
        if s == 5:
            metrics["adv/pos_neg_mass_ratio"] = math.nan  # a NaN literal, as json.dumps writes it
        if s == 6:
            metrics["adv/pos_neg_mass_ratio"] = "NaN"  # or as a string
            metrics["lld/logp_pos"] = "-Infinity"
        lines.append(json.dumps({"step": s, "metrics": metrics}))
    lines.append(json.dumps({"step": 7, "metrics": {"lld/logp_pos": -0.3}}))  # a step sent in two parts
    for key, status in (("run-a", "finished"), ("run-b", "failed")):
        (lab / "runs" / f"{key}.json").write_text(json.dumps(_record(key, status)))
        work = lab / "work" / key
        work.mkdir(parents=True)
        (work / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (lab / "summary.json").write_text(json.dumps({"command": "lldmon lab run --preset early --out lab"}))
    return lab, rewards


def test_export_reads_back_every_metric_and_the_label(tmp_path: Path) -> None:
    lab, rewards = _lab(tmp_path)
    out = tmp_path / "fixtures"
    written = export_lab(lab, out)
    assert [p.name for p in written] == ["run-a.jsonl.gz"]  # the failed run is left out
    run = read_fixture(written[0])
    h = run.header
    assert h["format"] == FORMAT and h["source"] == "lab" and h["name"] == "run-a" and h["seed"] == 3
    assert h["command"].startswith("python examples/search_r1_grpo.py") and "--seed 3" in h["command"]
    assert h["lab_command"] == "lldmon lab run --preset early --out lab"
    assert h["settings"] == {"model": "tiny", "lr": 0.001, "steps": 40} and h["steps"] == 40
    assert h["lldmon_live"]["alerts"][0]["kind"] == "garbled_outputs"
    expected = collapse_step(sorted(rewards), [rewards[s] for s in sorted(rewards)])
    assert expected is not None
    assert h["label"] == {"collapses": True, "collapse_step": expected, "rule": RULE}
    assert run.steps == list(range(1, 41))
    assert run.rows[6]["lld/logp_pos"] == -0.3 and run.rows[6][M.GRAD_NORM] == pytest.approx(0.57)
    assert math.isnan(run.rows[4]["adv/pos_neg_mass_ratio"]) and math.isnan(
        run.rows[5]["adv/pos_neg_mass_ratio"]
    )
    assert run.rows[5]["lld/logp_pos"] == -math.inf
    # strict JSON on disk: no NaN / Infinity literals
    text = gzip.decompress(written[0].read_bytes()).decode()
    assert '"NaN"' in text and "-Infinity" in text
    for line in text.splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))

    labelled = run.to_labelled_run()
    assert labelled.source == SOURCE_LAB and labelled.collapses and labelled.collapse_step == expected
    assert labelled.present is not None
    mass = labelled.values["adv/pos_neg_mass_ratio"]
    assert labelled.present["adv/pos_neg_mass_ratio"].tolist() == [s in (5, 6) for s in range(1, 41)]
    assert np.isnan(mass).all()  # logged as NaN at 5 and 6, absent elsewhere
    assert int(labelled.present[M.REWARD_MEAN].sum()) == len(rewards)


def test_a_centred_run_is_labelled_on_the_task_success(tmp_path: Path) -> None:
    """A run whose reward design is not exact match: the label is the rule on `rewards/exact_match/mean`
    and names that series; the same rows without the reward design keep the `reward/mean` label."""
    lab, rewards = _lab(tmp_path)
    record = json.loads((lab / "runs" / "run-a.json").read_text())
    record["setting"]["reward_design"] = "centred"
    (lab / "runs" / "run-a.json").write_text(json.dumps(record))
    metrics = lab / "work" / "run-a" / "metrics.jsonl"
    lines = []
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        if M.REWARD_MEAN in row["metrics"]:  # the task collapses; the optimised reward is centred
            row["metrics"][TASK_SUCCESS] = row["metrics"][M.REWARD_MEAN]
            row["metrics"][M.REWARD_MEAN] = 0.01 if row["step"] % 4 == 1 else -0.01
        lines.append(json.dumps(row))
    metrics.write_text("\n".join(lines) + "\n")
    (path,) = export_lab(lab, tmp_path / "fixtures", ["run-a"])
    run = read_fixture(path)
    expected = collapse_step(sorted(rewards), [rewards[s] for s in sorted(rewards)])
    assert expected is not None
    label = {"collapses": True, "collapse_step": expected, "rule": RULE, "series": TASK_SUCCESS}
    assert run.header["label"] == label == label_of(run.steps, run.rows, run.header["settings"])
    assert run.to_labelled_run().collapse_step == expected
    assert label_of(run.steps, run.rows)["collapse_step"] != expected  # the centred reward says otherwise
    assert "series" not in label_of(run.steps, run.rows, {"reward_design": "exact"})


def test_csv_reads_back_through_the_generic_csv_importer(tmp_path: Path) -> None:
    """`python -m lldmon_lab.lab.fixtures csv` + `lldmon import --format csv`: a recorded run into any
    service, every value (NaN and inf included) and every gap as recorded."""
    from monitor.importers import load_log

    lab, _ = _lab(tmp_path)
    (fixture,) = export_lab(lab, tmp_path / "fixtures")
    run = read_fixture(fixture).to_labelled_run()
    out = tmp_path / "run.csv"
    assert main(["csv", str(fixture), "--out", str(out)]) == 0
    log = load_log([out], "csv")
    assert log.steps.tolist() == run.steps.tolist()
    assert run.present is not None
    for name, values in run.values.items():
        assert log.present[name].tolist() == run.present[name].tolist(), name
        np.testing.assert_array_equal(log.values[name], values)
    assert write_csv(read_fixture(fixture), tmp_path / "again.csv") == len(run.steps)


def test_export_is_reproducible_and_selects_runs(tmp_path: Path) -> None:
    lab, _ = _lab(tmp_path)
    a = export_lab(lab, tmp_path / "a", ["run-a"])
    b = export_lab(lab, tmp_path / "b")
    assert a[0].read_bytes() == b[0].read_bytes()
    with pytest.raises(FixtureError, match="no such run"):
        export_lab(lab, tmp_path / "c", ["run-z"])
    with pytest.raises(FixtureError, match="status 'failed'"):
        export_lab(lab, tmp_path / "c", ["run-b"])
    with pytest.raises(FixtureError, match="no run records"):
        export_lab(tmp_path / "empty", tmp_path / "c")


def test_export_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab, _ = _lab(tmp_path)
    out = tmp_path / "fx"
    assert main(["export", str(lab), "--out", str(out), "--runs", "run-a"]) == 0
    assert "1 fixtures in" in capsys.readouterr().out
    assert main(["show", str(out / "run-a.jsonl.gz")]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["label"]["collapses"] is True and "lldmon_live" not in shown
    assert main(["export", str(lab), "--out", str(out), "--runs", "nope"]) == 2
    assert "no such run" in capsys.readouterr().err


def test_unreadable_fixtures_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.jsonl.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(FixtureError, match=r"x\.jsonl\.gz"):
        read_fixture(bad)
    header = {"format": FORMAT, "name": "r", "source": "lab", "label": {"collapses": False}}
    write_fixture(bad, header, [], [])
    with pytest.raises(FixtureError, match="no label"):
        read_fixture(bad)
    header["label"] = {"collapses": False, "collapse_step": None, "rule": RULE}
    write_fixture(bad, header, [2, 1], [{"loss": 1.0}, {"loss": 2.0}])
    with pytest.raises(FixtureError, match="step 1 is not after 2"):
        read_fixture(bad)
    write_fixture(bad, {**header, "format": "other/9"}, [], [])
    with pytest.raises(FixtureError, match="header"):
        read_fixture(bad)


# ---- the committed fixtures (tests/fixtures/lab) -------------------------------------------------


def _committed() -> list[Path]:
    return sorted(COMMITTED.glob("*.jsonl.gz"))


def test_committed_fixtures_are_labelled_by_the_one_rule() -> None:
    paths = _committed()
    assert paths, f"no fixtures in {COMMITTED}"
    assert sum(p.stat().st_size for p in paths) < 5 * 2**20  # "a few MB in all"
    labelled = {r.name: r for r in load_fixtures(COMMITTED)}
    for path in paths:
        run = read_fixture(path)
        h = run.header
        assert h["source"] == "lab" and h["label"]["rule"] == RULE, path.name
        assert h["label"] == label_of(run.steps, run.rows, h["settings"]), path.name  # recomputed identically
        assert "examples/search_r1_grpo.py" in h["command"] and f"--seed {h['seed']}" in h["command"]
        assert h["steps"] == len(run.steps) and run.steps[-1] >= h["settings"]["steps"], path.name
        design = h["settings"].get("reward_design", "exact")
        # the task's success for a reward design other than exact match, the reward otherwise
        series = h["label"].get("series", M.REWARD_MEAN)
        assert series == (M.REWARD_MEAN if design == "exact" else TASK_SUCCESS), path.name
        assert (design != "exact") == (f"--reward-design {design}" in h["command"]), path.name
        steps, values = run.series(series)
        assert len(steps) >= 10 and collapse_step(steps, values) == h["label"]["collapse_step"]
        # the three-way label on the same series: a damaged run is not scored as a control
        assert labelled[h["name"]].damaged == (outcome(steps, values) == DAMAGED), path.name


def test_committed_fixtures_are_scored_as_the_lab_source() -> None:
    """The detector's score on the lab runs is reported per source (not asserted good: issue 14)."""
    runs = load_fixtures(COMMITTED)
    assert len(runs) == len(_committed()) and all(r.source == SOURCE_LAB for r in runs)
    report = evaluate(runs)
    (lab,) = report.sources
    collapsing = sum(r.collapses for r in runs)
    damaged = sum(r.damaged for r in runs)
    assert (lab.source, lab.runs, lab.collapsing, lab.controls, lab.damaged) == (
        "lab",
        len(runs),
        collapsing,
        len(runs) - collapsing - damaged,
        damaged,
    )
    assert (
        0
        <= lab.caught_before_crash
        <= lab.any_finding_before_crash + lab.caught_before_crash
        <= 2 * collapsing
    )
    assert {t.source for t in report.targets} == {"lab"}
    assert [r.collapse_step for r in report.runs] == [r.collapse_step for r in runs]
    text = render(report, per_run=True)
    assert "score per source" in text
    assert any(line.startswith("lab ") for line in text.splitlines())
    for r in runs:
        assert r.name in text


def test_eval_command_prints_the_score_per_source(tmp_path: Path) -> None:
    """The command's plumbing, on three of the committed runs (the score of all of them is the test
    above's: replaying every one costs a minute of detector time)."""
    some = tmp_path / "some"
    some.mkdir()
    for path in [p for p in _committed() if "_n80_" in p.name][:3]:
        shutil.copy(path, some / path.name)
    result = runner.invoke(
        app, ["eval", "--collapse", "1", "--controls", "1", "--no-found", "--lab", str(some)]
    )
    assert result.exit_code == 0, result.output
    assert "lab: 3 recorded runs" in result.output
    rows = {line.split()[0] for line in result.output.splitlines() if line.strip()}
    assert {"generated", "lab"} <= rows
    no_lab = runner.invoke(app, ["eval", "--collapse", "1", "--controls", "1", "--no-lab", "--no-found"])
    assert no_lab.exit_code == 0 and "\nlab " not in no_lab.output
    bad_gate = runner.invoke(app, ["eval", "--collapse", "1", "--controls", "0", "--gate", "nope"])
    assert bad_gate.exit_code == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "x.jsonl.gz").write_bytes(b"junk")
    broken = runner.invoke(app, ["eval", "--collapse", "1", "--controls", "0", "--lab", str(empty)])
    assert broken.exit_code == 2 and "x.jsonl.gz" in broken.output

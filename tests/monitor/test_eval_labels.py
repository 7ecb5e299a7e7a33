"""Labels files of real runs (`lldmon eval --labels`): parsing, clear errors naming the entry and the field,
labelling (given or by the one collapse rule), and the repo's labels of ../shared/datasets/real_runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from contracts import metrics as M
from lldmon_lab.evaluation import FOUND_LABELS, SOURCE_THIRD_PARTY, labelled_runs, real_runs
from lldmon_lab.labels import collapse_step
from lldmon_lab.run_labels import DEFAULT_LABELS, LabelsError, parse_labels, read_labels
from monitor.cli import app
from monitor.importers import load_log

REAL = Path(__file__).resolve().parents[2].parent / "shared/datasets/real_runs"
needs_real = pytest.mark.skipif(not REAL.is_dir(), reason=f"{REAL} (the shared real logs) is missing")

GOOD = """
[[run]]
name = "a"
path = "logs/a.log"
collapses = false
note = "README: healthy"

[[run]]
name = "b"
path = ["logs/b1.log", "/abs/b2.log"]
format = "verl-console"
collapses = true
collapse_step = 12
note = "PROVENANCE: collapse at 12"

[[run]]
name = "c"
path = "c.csv"
collapses = true
note = "by the rule"
"""


def test_parse_a_good_file(tmp_path: Path) -> None:
    a, b, c = parse_labels(GOOD, "labels.toml", tmp_path)
    assert (a.name, a.paths, a.fmt, a.collapses, a.collapse_step) == (
        "a",
        (tmp_path / "logs/a.log",),
        "auto",
        False,
        None,
    )
    assert b.paths == (tmp_path / "logs/b1.log", Path("/abs/b2.log")) and b.fmt == "verl-console"
    assert (b.collapses, b.collapse_step, b.note, b.entry) == (True, 12, "PROVENANCE: collapse at 12", 2)
    assert c.collapses and c.collapse_step is None
    file = tmp_path / "sub" / "labels.toml"
    file.parent.mkdir()
    file.write_text(GOOD)
    assert read_labels(file)[0].paths == (file.parent / "logs/a.log",)  # default root: the file's folder
    assert read_labels(file, tmp_path)[0].paths == (tmp_path / "logs/a.log",)


ENTRY = 'name = "x"\npath = "x.log"\ncollapses = true\nnote = "n"\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[run]\n", r"labels\.toml: not valid TOML"),
        ("", r"labels\.toml: no \[\[run\]\] entries"),
        ('title = "x"\n', r"unknown top-level key\(s\) title"),
        ("run = 3\n", r"no \[\[run\]\] entries"),
        ("run = [1]\n", r"run 1: not a table"),
        ('[[run]]\npath = "x.log"\ncollapses = true\nnote = "n"\n', r"run 1: field 'name': missing"),
        ('[[run]]\nname = "x"\ncollapses = true\nnote = "n"\n', r"run 1 \('x'\): field 'path': missing"),
        ('[[run]]\nname = "x"\npath = "x.log"\nnote = "n"\n', r"run 1 \('x'\): field 'collapses': missing"),
        ('[[run]]\nname = "x"\npath = "x.log"\ncollapses = true\n', r"run 1 \('x'\): field 'note': missing"),
        (
            "[[run]]\n" + ENTRY.replace("collapses = true", 'collapses = "yes"'),
            r"field 'collapses': expected",
        ),
        ("[[run]]\n" + ENTRY.replace("collapses", "colapses"), r"field 'colapses': unknown field"),
        ("[[run]]\n" + ENTRY + "collapse_step = -1\n", r"field 'collapse_step': expected an integer >= 0"),
        ("[[run]]\n" + ENTRY + "collapse_step = true\n", r"field 'collapse_step': expected an integer"),
        ("[[run]]\n" + ENTRY + "collapse_step = 1.5\n", r"field 'collapse_step': expected an integer"),
        (
            "[[run]]\n" + ENTRY.replace("true", "false") + "collapse_step = 4\n",
            r"field 'collapse_step': given for a run with collapses = false",
        ),
        ("[[run]]\n" + ENTRY + 'format = "parquet"\n', r"field 'format': 'parquet' is not one of auto"),
        ("[[run]]\n" + ENTRY.replace('"x.log"', "[]"), r"field 'path': expected a file name or a non-empty"),
        ("[[run]]\n" + ENTRY.replace('"x.log"', "3"), r"field 'path': expected"),
        ("[[run]]\n" + ENTRY.replace('note = "n"', 'note = " "'), r"field 'note': expected a non-empty"),
        ("[[run]]\n" + ENTRY.replace('name = "x"', "name = 1"), r"run 1: field 'name': expected a non-empty"),
        ("[[run]]\n" + ENTRY + "[[run]]\n" + ENTRY, r"run 2 \('x'\): field 'name': 'x' is already run 1's"),
    ],
)
def test_bad_files_name_the_entry_and_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(LabelsError, match=message):
        parse_labels(text, "labels.toml", tmp_path)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(LabelsError, match=r"missing\.toml: cannot read the labels file"):
        read_labels(tmp_path / "missing.toml")


def verl_log(path: Path, rewards: list[float]) -> Path:
    path.write_text(
        "".join(f"step:{s} - critic/score/mean:{r} - actor/grad_norm:1.0\n" for s, r in enumerate(rewards))
    )
    return path


def write_labels(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


def test_labelled_runs_given_and_computed_labels(tmp_path: Path) -> None:
    crash = [0.5] * 30 + [0.0] * 30
    verl_log(tmp_path / "crash.log", crash)
    verl_log(tmp_path / "flat.log", [0.5] * 60)
    labels = write_labels(
        tmp_path / "labels.toml",
        """
[[run]]
name = "given"
path = "crash.log"
collapses = true
collapse_step = 31
note = "by hand"

[[run]]
name = "rule"
path = "crash.log"
format = "verl-console"
collapses = true
note = "by the rule"

[[run]]
name = "control"
path = "flat.log"
collapses = false
note = "healthy"

[[run]]
name = "absent"
path = ["flat.log", "gone.log"]
collapses = false
note = "a file is missing"
""",
    )
    loaded = labelled_runs(labels)
    assert [r.name for r in loaded.runs] == ["given", "rule", "control"]
    assert [m.name for m in loaded.missing] == ["absent"]
    assert loaded.missing[0].missing_files() == [tmp_path / "gone.log"]
    given, rule, control = loaded.runs
    assert given.collapse_step == 31 and given.collapses and given.source == SOURCE_THIRD_PARTY
    expected = collapse_step(list(range(60)), crash)
    assert expected is not None and rule.collapse_step == expected
    assert not control.collapses and control.collapse_step is None
    assert control.values[M.REWARD_MEAN].tolist() == [0.5] * 60


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            'path = "flat.log"\ncollapses = true\n',
            r"run 1 \('r'\): field 'collapse_step': missing, and the collapse rule .* finds no collapse",
        ),
        (
            'path = "flat.log"\ncollapses = true\ncollapse_step = 99\n',
            r"field 'collapse_step': 99 is outside",
        ),
        ('path = "bad.csv"\ncollapses = false\n', r"run 1 \('r'\): field 'path': .*bad\.csv: no step column"),
    ],
)
def test_labelled_runs_errors_name_the_entry(tmp_path: Path, entry: str, message: str) -> None:
    verl_log(tmp_path / "flat.log", [0.5] * 60)
    (tmp_path / "bad.csv").write_text("time,loss\n0,1\n")
    labels = write_labels(tmp_path / "labels.toml", f'[[run]]\nname = "r"\nnote = "n"\n{entry}')
    with pytest.raises(LabelsError, match=message):
        labelled_runs(labels)


def test_eval_reports_a_bad_labels_file(tmp_path: Path) -> None:
    labels = write_labels(tmp_path / "labels.toml", '[[run]]\nname = "r"\n')
    result = CliRunner().invoke(
        app, ["eval", "--collapse", "0", "--controls", "0", "--no-lab", "--labels", str(labels)]
    )
    assert result.exit_code == 2 and "field 'path': missing" in result.output


def test_default_labels_parse() -> None:
    labels = read_labels(DEFAULT_LABELS, REAL)
    names = [label.name for label in labels]
    assert len(names) == len(set(names)) == 11
    collapsing = [label for label in labels if label.collapses]
    assert [(label.name, label.collapse_step) for label in collapsing] == [("aopd-retool-qwen3-4b-grpo", 11)]
    assert all(label.note for label in labels)


@needs_real
def test_default_labels_cover_every_real_log() -> None:
    labels = read_labels(DEFAULT_LABELS, REAL)
    listed = {p.resolve() for label in labels for p in label.paths}
    assert all(p.is_file() for p in listed)
    logs = {
        p.resolve()
        for p in REAL.rglob("*")
        if p.is_file() and (p.suffix == ".log" or p.name.endswith("_telemetry.csv"))
    }
    assert logs == listed


@needs_real
def test_real_runs_carry_their_labels() -> None:
    """Labels only: what the detector finds on them is the evaluation's business, not this test's."""
    runs = {r.name: r for r in real_runs(REAL)}
    assert len(runs) == 11 and all(r.source == SOURCE_THIRD_PARTY for r in runs.values())
    aopd = runs["aopd-retool-qwen3-4b-grpo"]
    assert aopd.collapses and aopd.collapse_step == 11
    # the rule cannot label it: the score is negative throughout (peak below min_peak)
    assert collapse_step(aopd.steps, aopd.values[M.REWARD_MEAN]) is None
    controls = [r for r in runs.values() if not r.collapses]
    assert len(controls) == 10
    for r in controls:  # the rule agrees that the controls do not collapse
        assert collapse_step(r.steps, r.values[M.REWARD_MEAN]) is None, r.name
    boerz = load_log([REAL / "boerz_alfworld_grpo7b_3seeds/run_a_telemetry.csv"])
    assert runs["alfworld-grpo-qwen2.5-7b-seed0"].steps.tolist() == boerz.steps.tolist()


FOUND = Path(__file__).resolve().parents[1] / "fixtures/third_party"


def test_found_runs_all_load_with_their_labels() -> None:
    """The licensed third-party logs committed under tests/fixtures/third_party (signed and composite
    rewards): every entry imports, no file is missing, and each collapse label is a step of its run."""
    found = labelled_runs(FOUND_LABELS, FOUND)
    assert not found.missing
    assert len(found.runs) == 7
    collapsing = {r.name: r.collapse_step for r in found.runs if r.collapses}
    assert collapsing == {
        "aopd-retool-qwen2.5-3b-grpo-klreward-gjvwlq13": 38,
        "aopd-retool-qwen2.5-3b-grpo-tokenkl0.1-yeu8r64c": 31,
    }
    for run in found.runs:
        assert run.source == SOURCE_THIRD_PARTY
        rewards = run.values[M.REWARD_MEAN]
        assert run.steps.size >= 50
        if run.name.startswith("aopd-"):  # the ReTool score is signed: the 0..1 collapse rule says nothing
            assert (
                float(rewards[np.isfinite(rewards)].max()) < 0.2 and collapse_step(run.steps, rewards) is None
            )


def test_found_runs_controls_get_no_critical_finding() -> None:
    """The five healthy runs with signed / composite rewards: no critical finding (the detector is judged on
    them without ever having been tuned to them)."""
    from lldmon_lab.evaluation import evaluate

    runs = [r for r in labelled_runs(FOUND_LABELS, FOUND).runs if not r.collapses]
    report = evaluate(runs)
    assert len(report.runs) == 5
    assert [r.name for r in report.runs if r.critical_kinds] == []

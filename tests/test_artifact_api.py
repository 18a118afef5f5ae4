"""`asyncsoak.artifact`: the public read side, on real soaks' artifacts and journals."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from jsonschema import Draft202012Validator

from asyncsoak import ValidationError, artifact
from asyncsoak._contract._schema import schema_text

from .conftest import assert_valid, asyncsoak_cli
from .soak_runs import Runs, make_runs


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return make_runs(tmp_path_factory.mktemp("runs"))


def test_load_reads_a_soaks_artifact(runs: Runs) -> None:
    """load() of a soak.json is the artifact the soak wrote, as written."""
    loaded = artifact.load(runs.stalled)
    assert loaded == json.loads(runs.stalled.read_text())
    assert loaded["status"] == artifact.SoakStatus.FAILED
    assert [f["reason"] for f in loaded["failures"]] == [artifact.FailureReason.STALE_PROGRESS]


def test_load_takes_a_string_path(runs: Runs) -> None:
    """A path given as a string reads the same artifact."""
    assert artifact.load(str(runs.passing)) == artifact.load(runs.passing)


def test_load_rebuilds_a_dead_monitors_journal_as_recover_does(
    runs: Runs, tmp_path: Path, schema: Draft202012Validator
) -> None:
    """load() of a killed monitor's journal is monitor_lost, the artifact `recover` writes."""
    loaded = artifact.load(runs.killed_journal)
    assert loaded["status"] == artifact.SoakStatus.FAILED
    assert [f["reason"] for f in loaded["failures"]] == [artifact.FailureReason.MONITOR_LOST]
    assert loaded["monitor"]["recovered_from_journal"] == str(runs.killed_journal)
    assert_valid(loaded, schema)
    out = tmp_path / "recovered.json"
    result = asyncsoak_cli("recover", str(runs.killed_journal), "-o", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    recovered = json.loads(out.read_text())
    # Built twice, so the time it was built differs; everything the run left is the same.
    for monitor in (cast("dict[str, Any]", loaded["monitor"]), recovered["monitor"]):
        monitor.pop("artifact_written_at", None)
    assert loaded == recovered


def test_load_of_a_finished_journal_keeps_the_monitors_verdict(runs: Runs) -> None:
    """A journal that ends with its finished line gives the monitor's own status and reasons."""
    journal = runs.stalled.with_suffix(".jsonl")
    loaded = artifact.load(journal)
    written = artifact.load(runs.stalled)
    assert loaded["status"] == written["status"] == artifact.SoakStatus.FAILED
    assert loaded["failures"] == written["failures"]
    assert loaded["stop"]["cause"] == written["stop"]["cause"] == artifact.StopCause.FAILURE


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("not json at all", "is not an asyncsoak artifact or journal"),
        ('["a list"]', "is not an asyncsoak artifact or journal"),
        ('{"schema_version": 99}', "schema version 99"),
        ('{"schema_version": 2, "status": "passed"}', "failures"),
    ],
)
def test_load_refuses_what_is_not_an_artifact(tmp_path: Path, content: str, says: str) -> None:
    """A file that is neither an artifact nor a journal is an ArtifactError naming the file."""
    path = tmp_path / "soak.json"
    path.write_text(content)
    with pytest.raises(artifact.ArtifactError, match=says) as caught:
        artifact.load(path)
    assert str(path) in str(caught.value)
    assert isinstance(caught.value, ValidationError)
    assert isinstance(caught.value, ValueError)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("damage", "says"),
    [
        # An entry of its own: a passing run on a loaded machine may have too few samples
        # for any trend, and the check must be exercised all the same.
        (lambda a: a["trends"].update({"tree.anon_bytes": {}}), "trends.tree.anon_bytes has no"),
        (lambda a: a["series"]["tree"].pop("t"), "series.tree has no 't'"),
        (lambda a: a["series"]["tree"].update(rss_bytes="big"), "series.tree.rss_bytes is str"),
    ],
)
def test_load_checks_the_entries_of_sections_keyed_by_data(
    runs: Runs, tmp_path: Path, damage: Callable[[dict[str, Any]], object], says: str
) -> None:
    """A damaged trend entry or series group is an ArtifactError, not a KeyError in a view."""
    data = json.loads(runs.passing.read_text())
    damage(data)
    path = tmp_path / "soak.json"
    path.write_text(json.dumps(data))
    with pytest.raises(artifact.ArtifactError, match=says):
        artifact.load(path)


def test_load_of_a_missing_file_is_an_os_error(tmp_path: Path) -> None:
    """A path that does not exist raises FileNotFoundError, not an artifact error."""
    with pytest.raises(FileNotFoundError):
        artifact.load(tmp_path / "soak.json")


def test_summarize_is_what_summary_json_prints(runs: Runs) -> None:
    """summarize(load(path)) equals `asyncsoak summary --json` of the same run."""
    result = asyncsoak_cli("summary", str(runs.stalled), "--json", cwd=runs.stalled.parent)
    assert result.returncode == 0, result.stderr
    facts = artifact.summarize(artifact.load(runs.stalled))
    assert json.loads(json.dumps(facts, default=str)) == json.loads(result.stdout)
    assert facts["status"] == "failed"
    assert facts["reasons"][0]["reason"] == "stale_progress"


def test_schema_is_the_shipped_schema_and_validates_real_artifacts(runs: Runs) -> None:
    """schema() is artifact.schema.json, and a real soak's artifact is valid against it."""
    shipped = Path(artifact.__file__).with_name("artifact.schema.json")
    assert artifact.schema() == json.loads(shipped.read_text())
    validator = Draft202012Validator(artifact.schema())
    for path in (runs.passing, runs.stalled):
        assert_valid(artifact.load(path), validator)
    assert artifact.load(runs.passing)["schema_version"] == artifact.SCHEMA_VERSION


def test_the_shipped_schema_is_generated_from_the_typed_dicts() -> None:
    """artifact.schema.json is what the TypedDicts of ``_contract._schema`` give, to the byte."""
    shipped = Path(artifact.__file__).with_name("artifact.schema.json").read_text()
    assert shipped == schema_text(), "rewrite it: python -m asyncsoak._contract._schema"


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda a: a.update(status="fine"), "'fine' is not one of"),
        (lambda a: a["exit"].pop("pid"), "'pid' is a required property"),
        (lambda a: a.update(duration_seconds=-1), "less than the minimum of 0"),
        (lambda a: a.update(started_at="yesterday"), "does not match"),
        (lambda a: a.pop("trends"), "'trends' is a required property"),
        (lambda a: a["processes"].extend(a["processes"][:1] * 9), "is too long"),
        (lambda a: a["failures"].append({"reason": "stale_progress", "message": "m"}), "'at'"),
        (lambda a: a["snapshot"].update(scheduler={"kind": "lsf"}), "is not valid under any"),
    ],
)
def test_the_schema_refuses_a_damaged_artifact(
    runs: Runs, damage: Callable[[dict[str, Any]], object], says: str
) -> None:
    """The generated schema checks what the hand-kept one did: required keys, enums, minimums,
    timestamps, version 2's sections, bounded lists, the scheduler's kinds."""
    data = json.loads(runs.passing.read_text())
    damage(data)
    errors = [e.message for e in Draft202012Validator(artifact.schema()).iter_errors(data)]
    assert any(says in error for error in errors), errors


def test_schema_is_a_fresh_copy(runs: Runs) -> None:
    """Changing the returned schema changes neither later calls nor how load() checks."""
    mine = artifact.schema()
    mine["required"].append("no_such_key")
    assert "no_such_key" not in artifact.schema()["required"]
    assert artifact.load(runs.passing)["status"] == "passed"

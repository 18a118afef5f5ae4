"""The public surface: exports, lazy imports, the error type."""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from jsonschema import Draft202012Validator

import asyncsoak
from asyncsoak import SoakFailureError, ValidationError, ValidationTypeError
from asyncsoak.artifact import Artifact, SoakStatus, StopCause

from .conftest import assert_valid, py


def test_all_lists_exactly_the_public_exports() -> None:
    """__all__ is sorted and every name in it resolves."""
    assert asyncsoak.__all__ == sorted(asyncsoak.__all__)
    for name in asyncsoak.__all__:
        assert getattr(asyncsoak, name) is not None
    public = {n for n in dir(asyncsoak) if not n.startswith("_")}
    assert set(asyncsoak.__all__) <= public


def test_importing_the_package_is_lazy() -> None:
    """`import asyncsoak` pulls in neither anyio nor psutil until a name is used."""
    code = "import sys, asyncsoak; print('anyio' in sys.modules, 'psutil' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_soak_failure_error_is_a_runtime_error() -> None:
    """SoakFailureError is a RuntimeError carrying the reason, failures and artifact path."""
    artifact = {"failures": [{"reason": "stale_progress", "message": "m", "at": None}]}
    error = SoakFailureError(artifact, Path("x.json"))
    assert isinstance(error, RuntimeError)
    assert error.reason == "stale_progress"
    assert error.failures == artifact["failures"]
    assert error.artifact_path == Path("x.json")


@pytest.mark.asyncio
async def test_run_soak_takes_one_config_and_returns_the_whole_artifact(
    tmp_path: Path, schema: Draft202012Validator
) -> None:
    """run_soak(config=SoakConfig(...)) runs the soak its fields say and returns the typed
    artifact it wrote: every section, the vocabulary's words as the enums' members."""
    config = asyncsoak.SoakConfig(
        command=(*py("import os, sys; os.makedirs(sys.argv[1])"), str(tmp_path / "progress")),
        progress_dir=tmp_path / "progress",
        output_path=tmp_path / "out" / "soak.json",
        sample_interval_seconds=0.1,
        nvidia_smi=None,
        metadata={"run": "config"},
    )
    with anyio.fail_after(60):
        result: Artifact = await asyncsoak.run_soak(config=config)
    assert result["status"] is SoakStatus.PASSED
    assert result["failures"] == []
    assert result["stop"]["cause"] is StopCause.EXITED
    assert result["metadata"] == {"run": "config"}
    assert result["config"]["sample_interval_seconds"] == 0.1
    assert result["log"]["path"] == str(tmp_path / "out" / "soak.log")
    assert result == json.loads(config.output_path.read_text())
    assert_valid(result, schema)
    assert set(Artifact.__required_keys__) <= set(result)


def test_run_soak_keeps_the_reference_keywords_and_takes_the_rest_from_soak_config() -> None:
    """run_soak names the reference's keywords (soak-monitor-reference.txt); its other
    keywords are SoakSettings', which are SoakConfig's other fields: the list is not spelled
    twice by hand without this check."""
    from asyncsoak._supervisor._front import SoakSettings

    reference = [
        "command",
        "progress_dir",
        "output_path",
        "sample_interval_seconds",
        "startup_timeout_seconds",
        "stale_progress_seconds",
        "post_shutdown_grace_seconds",
        "min_duration_seconds",
        "cwd",
        "env",
        "metadata",
    ]
    parameters = inspect.signature(asyncsoak.run_soak).parameters
    assert [name for name in parameters][: len(reference)] == reference
    assert set(parameters) == {*reference, "config", "control", "metrics", "settings"}
    settable = {spec.name for spec in dataclasses.fields(asyncsoak.SoakConfig) if spec.init}
    assert set(SoakSettings.__annotations__) == settable - set(reference)


@pytest.mark.asyncio
async def test_run_soak_refuses_config_with_keywords(tmp_path: Path) -> None:
    """The settings come one way: config with any of its keywords (even at its default
    value), a config that is not a SoakConfig, or keywords short of the required ones are
    refused before anything is launched or written."""
    output = tmp_path / "out" / "soak.json"
    config = asyncsoak.SoakConfig(
        command=("true",), progress_dir=tmp_path / "progress", output_path=output
    )
    with pytest.raises(ValidationTypeError, match="given with sample_interval_seconds"):
        await asyncsoak.run_soak(config=config, sample_interval_seconds=5.0)
    with pytest.raises(ValidationTypeError, match="config must be a SoakConfig, not dict"):
        await asyncsoak.run_soak(config={"command": ["true"]})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs command"):
        await asyncsoak.run_soak(progress_dir=tmp_path / "progress", output_path=output)
    with pytest.raises(TypeError, match="unexpected keyword argument 'interval'"):
        await asyncsoak.run_soak(config=config, interval=5.0)  # type: ignore[call-arg]
    assert not output.parent.exists()


def test_a_stop_cause_is_one_of_the_artifacts(tmp_path: Path) -> None:
    """SoakControl.request_stop's cause is the artifact's stop.cause: a word outside the
    vocabulary is refused when asked, not written into an artifact the schema refuses."""
    control = asyncsoak.SoakControl()
    with pytest.raises(ValidationError, match="cause must be a stop cause"):
        control.request_stop(cause="lunch")
    assert not control.stop_requested.is_set()
    control.request_stop(cause="scheduler")
    assert control.cause is StopCause.SCHEDULER

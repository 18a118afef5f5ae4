"""The vocabulary's enums match the artifact's JSON Schema and the events the code emits."""

from __future__ import annotations

import importlib
import json
import pkgutil
from enum import StrEnum
from typing import Any

import pytest

import asyncsoak
from asyncsoak import read_journal
from asyncsoak._contract import _schema, _schema_snapshot, _schema_tree, events
from asyncsoak._contract._vocabulary import (
    EventKind,
    FailureReason,
    GpuFaultKind,
    SoakStatus,
    StopCause,
)
from asyncsoak._record._artifact_io import load_schema

from .soak_runs import Runs, make_runs


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return make_runs(tmp_path_factory.mktemp("runs"))


def _schema_enum(*where: str) -> list[Any]:
    node: Any = load_schema()
    for key in where:
        node = node[key]
    enum: list[Any] = node["enum"]
    return enum


@pytest.mark.parametrize(
    ("enum", "where"),
    [
        (SoakStatus, ("properties", "status")),
        (FailureReason, ("properties", "failures", "items", "properties", "reason")),
        (StopCause, ("properties", "stop", "properties", "cause")),
        (
            GpuFaultKind,
            (
                "properties",
                "gpu_health",
                "additionalProperties",
                "properties",
                "faults",
                "items",
                "properties",
                "fault",
            ),
        ),
    ],
)
def test_enum_matches_the_schema_both_ways(enum: type[StrEnum], where: tuple[str, ...]) -> None:
    """Every member is a value the schema allows, and every value it allows is a member."""
    allowed = [value for value in _schema_enum(*where) if value is not None]
    assert sorted(member.value for member in enum) == sorted(allowed)
    assert len(allowed) == len(set(allowed)), "the schema lists a value twice"


def test_stop_cause_null_means_no_stop_sequence() -> None:
    """The schema's only value outside StopCause is null (the stop sequence never ran)."""
    extra = [
        v
        for v in _schema_enum("properties", "stop", "properties", "cause")
        if v not in set(StopCause)
    ]
    assert extra == [None]


def _event_classes() -> set[type[events.Event]]:
    # Every module, so an event class defined anywhere in the package is found.
    for info in pkgutil.walk_packages(asyncsoak.__path__, prefix="asyncsoak."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    found: set[type[events.Event]] = set()
    todo = list(events.Event.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        found.add(cls)
    return found


def test_event_kinds_are_the_kinds_of_the_event_classes() -> None:
    """EventKind has one member per event class's KIND, and no other."""
    kinds = sorted(cls.KIND for cls in _event_classes())
    assert len(kinds) == len(set(kinds)), "two event classes share a KIND"
    assert kinds == sorted(member.value for member in EventKind)


def test_an_event_serialises_its_kind_as_the_plain_string() -> None:
    """A member is its string: equal to the journal's value and written as it by json."""
    assert json.dumps({"kind": EventKind.GPU_SAMPLE}) == '{"kind": "gpu_sample"}'
    assert EventKind("finished") is EventKind.FINISHED


def test_real_journals_hold_only_known_kinds_and_statuses(runs: Runs) -> None:
    """Every kind a real soak's journal holds is an EventKind; each verdict is a SoakStatus."""
    seen: set[str] = set()
    for journal in (
        runs.passing.with_suffix(".jsonl"),
        runs.stalled.with_suffix(".jsonl"),
        runs.killed_journal,
    ):
        for event in read_journal(journal):
            seen.add(event["kind"])
            if event["kind"] == EventKind.FINISHED:
                assert event["status"] in set(SoakStatus)
            if event["kind"] == EventKind.FAILURE:
                assert event["reason"] in set(FailureReason)
            if event["kind"] == EventKind.STOP:
                assert event["cause"] in set(StopCause)
    assert seen <= set(EventKind), seen - set(EventKind)
    # The runs exercise the kinds every soak writes, the GPU sampler's and the failure path's.
    assert {"header", "started", "exited", "sample", "gpu_sample", "failure", "finished"} <= seen


@pytest.mark.parametrize(
    ("typed", "where"),
    [
        (_schema.Artifact, ()),
        (_schema.Failure, ("properties", "failures", "items")),
        (_schema.Exit, ("properties", "exit")),
        (_schema.ExceptionInfo, ("properties", "exit", "properties", "exception")),
        (_schema.Config, ("properties", "config")),
        (_schema.Trend, ("properties", "trends", "additionalProperties")),
        (_schema_tree.ProcessEntry, ("properties", "processes", "items")),
        (_schema.Progress, ("properties", "progress")),
        (_schema.Stop, ("properties", "stop")),
        (_schema.Log, ("properties", "log")),
        (_schema.Monitor, ("properties", "monitor")),
        (_schema_tree.OomKillEntry, ("properties", "oom_kills", "items")),
        (_schema_tree.ProcessRecord, ("$defs", "process")),
        (_schema_snapshot.SnapshotSection, ("properties", "snapshot")),
    ],
)
def test_typed_sections_require_what_the_schema_requires(
    typed: Any, where: tuple[str | int, ...]
) -> None:
    """A key a reader may index (required in the TypedDict) is one the schema requires, and
    every key the schema requires is a required key of the TypedDict."""
    node: Any = load_schema()
    for key in where:
        node = node[key]
    # A section with no key every artifact holds (the snapshot) names none.
    assert set(typed.__required_keys__) == set(node.get("required", []))
    assert set(node.get("properties", {})) <= set(typed.__annotations__)

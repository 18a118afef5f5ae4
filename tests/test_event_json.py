"""Each event kind's JSON form has one TypedDict, and each fold's handlers take their kinds'."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any, get_args, get_type_hints

import pytest

from asyncsoak._contract._events import (
    JOURNAL_SAMPLE_KEYS,
    Event,
    EventFold,
    EventJson,
    KeptEventJson,
    event_to_json,
)
from asyncsoak._contract._vocabulary import EventKind
from asyncsoak._export._metrics import SoakMetrics
from asyncsoak._record._artifact import ArtifactBuilder
from asyncsoak._supervisor._judge import RunJudge
from asyncsoak._view._live import LiveState
from asyncsoak._view.report._detail import _DetailFold

from .test_vocabulary import _event_classes


def _kind_of(json_type: type) -> str:
    (kind,) = get_args(get_type_hints(json_type)["kind"])
    return str(kind)


def _json_types() -> dict[str, Any]:
    """Kind -> the TypedDict of its JSON form, each kind once (a TypedDict class has no type
    of its own to name here)."""
    types = list(get_args(EventJson))
    by_kind = {_kind_of(t): t for t in types}
    assert len(by_kind) == len(types), "two TypedDicts of one kind"
    return by_kind


def test_every_kind_has_exactly_one_json_type() -> None:
    assert sorted(_json_types()) == sorted(EventKind)


def _an_event(cls: type[Event]) -> Event:
    """An event of ``cls`` with every field that has no default set (to None but ``t``: the
    JSON form's keys are what is compared here, not its values)."""
    required: dict[str, Any] = {
        f.name: None
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    return cls(**{**required, "t": 0.0})


EVENT_CLASSES = sorted(_event_classes(), key=lambda c: c.KIND)


@pytest.mark.parametrize("cls", EVENT_CLASSES, ids=[c.KIND for c in EVENT_CLASSES])
def test_an_event_json_form_has_its_typeddict_keys(cls: type[Event]) -> None:
    """``event_to_json`` writes every key of the kind's TypedDict (the journal adds a sample's
    points and labels); the keys a journal of an older asyncsoak may lack, the fields with a
    default, are the ``NotRequired`` ones."""
    json_type = _json_types()[cls.KIND]
    written = set(event_to_json(_an_event(cls)))
    every = json_type.__required_keys__ | json_type.__optional_keys__
    assert written == every - JOURNAL_SAMPLE_KEYS
    with_default = {
        f.name
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    assert json_type.__optional_keys__ - JOURNAL_SAMPLE_KEYS == with_default


def test_the_kept_events_are_every_kind_the_artifact_keeps() -> None:
    """``artifact.events`` keeps every kind but the samples, the header, the snapshot and the
    steps, a forensics record as a mention."""
    kept = {_kind_of(t) for t in get_args(KeptEventJson)}
    left_out = {
        EventKind.SAMPLE,
        EventKind.GPU_SAMPLE,
        EventKind.HEADER,
        EventKind.SNAPSHOT,
        EventKind.STEP,
    }
    assert kept == set(EventKind) - left_out


FOLDS: list[Any] = [ArtifactBuilder, LiveState, SoakMetrics, RunJudge, _DetailFold]


@pytest.mark.parametrize("owner", FOLDS, ids=[owner.__name__ for owner in FOLDS])
def test_each_handler_takes_the_json_form_of_its_kinds(owner: Any) -> None:
    """A fold's handler registered for a kind reads that kind's TypedDict (the dispatch is
    where a line becomes it: a mismatch would go unseen by the type checker)."""
    fold: EventFold[Any] = owner._fold
    assert fold.handlers
    json_types = _json_types()
    for kind, handler in fold.handlers.items():
        event = list(inspect.signature(handler).parameters)[-1]
        hint = get_type_hints(handler)[event]
        taken = set(get_args(hint)) if typing.get_origin(hint) is not None else {hint}
        assert json_types[kind] in taken, f"{owner.__name__}.{handler.__name__} for {kind}"


def test_a_fold_ignores_a_kind_it_has_no_handler_for() -> None:
    """A kind no handler reads (or one a newer asyncsoak wrote) is skipped, and said so."""
    state = LiveState()
    assert not LiveState._fold.dispatch(state, {"t": 1.0, "kind": "from_the_future"})
    assert LiveState._fold.dispatch(state, {"t": 2.0, "kind": "warning", "message": "m"})
    assert state.warnings == 1


def test_a_kind_has_one_handler_per_fold() -> None:
    fold: EventFold[object] = EventFold()
    fold.on(EventKind.WARNING)(lambda owner, t, event: None)
    with pytest.raises(ValueError, match="two handlers"):
        fold.on(EventKind.WARNING)(lambda owner, t, event: None)

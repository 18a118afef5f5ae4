"""Each event kind's JSON form has one TypedDict, and each fold's handlers take their kinds'."""

from __future__ import annotations

import inspect
import typing
from typing import Any, get_args, get_type_hints

import pytest

from asyncsoak._contract import events
from asyncsoak._contract._vocabulary import EventKind
from asyncsoak._record._artifact import RunState
from asyncsoak._view._live_state import LiveState
from asyncsoak._view.report._timeline import _DetailFold

from .test_vocabulary import _event_classes

#: The keys the journal adds to a sample's JSON form (``SampleJson``'s points and labels).
JOURNAL_SAMPLE_KEYS = frozenset({"points", "labels"})


def _kind_of(json_type: type) -> str:
    (kind,) = get_args(get_type_hints(json_type)["kind"])
    return str(kind)


def _json_types() -> dict[str, Any]:
    """Kind -> the TypedDict of its JSON form, each kind once (a TypedDict class has no type
    of its own to name here)."""
    types = list(get_args(events.EventJson))
    by_kind = {_kind_of(t): t for t in types}
    assert len(by_kind) == len(types), "two TypedDicts of one kind"
    return by_kind


def test_every_kind_has_exactly_one_json_type() -> None:
    assert sorted(_json_types()) == sorted(EventKind)


def _an_event(cls: type[events.Event]) -> events.Event:
    """An event of ``cls`` with every field that has no default set (to None but ``t``: the
    JSON form's keys are what is compared here, not its values)."""
    required = {name: None for name in cls.FIELDS if name not in cls.DEFAULTS}
    return cls(**{**required, "t": 0.0})


EVENT_CLASSES = sorted(_event_classes(), key=lambda c: c.KIND)


@pytest.mark.parametrize("cls", EVENT_CLASSES, ids=[c.KIND for c in EVENT_CLASSES])
def test_an_event_json_form_has_its_typeddict_keys(cls: type[events.Event]) -> None:
    """``event_to_json`` writes every key of the kind's TypedDict (the journal adds a sample's
    points and labels); the keys a journal of an older asyncsoak may lack, the fields with a
    default, are the ``NotRequired`` ones."""
    json_type = _json_types()[cls.KIND]
    written = set(events.event_to_json(_an_event(cls)))
    every = json_type.__required_keys__ | json_type.__optional_keys__
    assert written == every - JOURNAL_SAMPLE_KEYS
    assert json_type.__optional_keys__ - JOURNAL_SAMPLE_KEYS == set(cls.DEFAULTS)


def test_the_kept_events_are_every_kind_the_artifact_keeps() -> None:
    """``artifact.events`` keeps every kind but the samples, the header, the snapshot and the
    steps (and a producer's broken rule: its failure is kept), a forensics record as a
    mention."""
    kept = {_kind_of(t) for t in get_args(events.KeptEventJson)}
    left_out = {
        EventKind.SAMPLE,
        EventKind.GPU_SAMPLE,
        EventKind.HEADER,
        EventKind.SNAPSHOT,
        EventKind.STEP,
        EventKind.RULE_BROKEN,
    }
    assert kept == set(EventKind) - left_out


FOLDS: list[Any] = [RunState, LiveState, _DetailFold]


@pytest.mark.parametrize("owner", FOLDS, ids=[owner.__name__ for owner in FOLDS])
def test_each_handler_takes_the_json_form_of_its_kinds(owner: Any) -> None:
    """A fold's handler registered for a kind reads that kind's TypedDict (the dispatch is
    where a line becomes it: a mismatch would go unseen by the type checker)."""
    fold: events.EventFold[Any] = owner._fold
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
    leak = {"t": 2.0, "kind": "trend", "series": "tree.rss_bytes", "verdict": "leak"}
    assert LiveState._fold.dispatch(state, leak)
    assert list(state.trends) == [("tree.rss_bytes", "leak")]
    state.add({"t": 3.0, "kind": "from_the_future"})
    state.add({"t": 4.0, "kind": "warning", "message": "m"})
    assert state.warnings == 1


def test_a_kind_has_one_handler_per_fold() -> None:
    fold: events.EventFold[object] = events.EventFold()
    fold.on(EventKind.WARNING)(lambda owner, t, event: None)
    with pytest.raises(ValueError, match="two handlers"):
        fold.on(EventKind.WARNING)(lambda owner, t, event: None)


def test_an_event_is_an_immutable_value() -> None:
    """Events compare and hash by their fields, show them, refuse assignment and unknown
    fields, and never share a default dict."""
    a = events.Progress(t=1.0, changed=1, paths=["x"], gap_seconds=None)
    assert a == events.Progress(1.0, 1, ["x"], None)
    assert a != events.Progress(2.0, 1, ["x"], None)
    assert hash(events.WarningEvent(t=1.0, message="m")) == hash(
        events.WarningEvent(t=1.0, message="m")
    )
    assert repr(events.WarningEvent(t=1.0, message="m")) == "WarningEvent(t=1.0, message='m')"
    with pytest.raises(AttributeError):
        a.changed = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        events.WarningEvent(t=1.0, message="m", colour="red")  # type: ignore[call-arg]
    assert a.rank_grown_bytes is not events.Progress(1.0, 1, [], None).rank_grown_bytes


def test_figures_given_again_have_the_json_form_of_fresh_ones() -> None:
    """A sleeping process's figures, the same object in sample after sample (their JSON form
    kept), read as figures built afresh would, with other events between the samples."""
    from asyncsoak._sampling._proc_sample import ProcessFigures, ProcSample

    def figures(cpu: float) -> ProcessFigures:
        return ProcessFigures(7, 1, "w", "sleeping", cpu, 4096, 0, 1, 3, 0, 0, ["w", "-x"])

    def sample(t: float, processes: list[ProcessFigures]) -> dict[str, Any]:
        return dict(events.event_to_json(ProcSample(t, 1, None, processes, None, {})))  # type: ignore[arg-type]

    kept = figures(0.0)
    fresh = sample(0.0, [figures(0.0)])["processes"]
    for t in (1.0, 2.0, 3.0):
        assert sample(t, [kept])["processes"] == fresh
        events.event_to_json(events.WarningEvent(t=t, message="between"))
    assert sample(4.0, [figures(12.5)])["processes"][0]["cpu_percent"] == 12.5

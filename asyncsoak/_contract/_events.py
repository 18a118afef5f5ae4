"""The verdicts' events, :data:`EventJson` (any event's JSON form, what the folds read),
:class:`EventFold` (the folds' one dispatch on ``kind``) and :func:`event_to_json` (the only
place an event becomes JSON)."""

# No ``from __future__ import annotations``: TypedDict reads ``NotRequired`` when evaluated.
from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from typing import Any, Generic, Literal, NotRequired, TypeVar, cast

from . import _sample_events as samples
from . import _tree_events as tree
from ._event import Event, EventJsonBase
from ._vocabulary import EventKind


class FailureEvent(Event, kind=EventKind.FAILURE):
    reason: str
    message: str
    at: str
    gpu: dict[str, Any] | None = None
    activity: dict[str, Any] | None = None


class FailureJson(EventJsonBase):
    kind: Literal[EventKind.FAILURE]
    reason: str  # a FailureReason
    message: str
    at: str
    gpu: NotRequired[dict[str, Any] | None]
    activity: NotRequired[dict[str, Any] | None]


class WarningEvent(Event, kind=EventKind.WARNING):
    """Something worth knowing that is no failure (a skipped directory, a late start)."""

    message: str


class WarningJson(EventJsonBase):
    kind: Literal[EventKind.WARNING]
    message: str


class TrendFound(Event, kind=EventKind.TREND):
    """A series' trend became confident: a leak, a projected breach, progress slowing."""

    series: str
    verdict: str
    slope_per_hour: float | None
    growth: float | None
    projected_limit_at: str | None
    message: str


class TrendJson(EventJsonBase):
    kind: Literal[EventKind.TREND]
    series: str
    verdict: str  # "leak", "breach_projected", "slowing", "withdrawn" ...
    slope_per_hour: float | None
    growth: float | None
    projected_limit_at: str | None
    message: str


#: The kinds ``artifact.events`` keeps as they are.
_KeptAsIs = (
    tree.StartedJson
    | tree.SpawnFailedJson
    | tree.ExitedJson
    | tree.TreeGoneJson
    | samples.ProgressJson
    | FailureJson
    | WarningJson
    | tree.StopJson
    | tree.SignalJson
    | tree.ForwardedJson
    | tree.RequeueJson
    | tree.StdinClosedJson
    | tree.LeftoverJson
    | tree.AbandonedJson
    | tree.OomKillJson
    | samples.SamplerDegradedJson
    | samples.SamplerRecoveredJson
    | samples.SamplerNoteJson
    | samples.GpuFaultJson
    | TrendJson
    | tree.ExceptionJson
    | samples.LimitsJson
    | tree.FinishedJson
)
#: Any event's JSON form, one member per :class:`EventKind`.
EventJson = (
    _KeptAsIs
    | tree.HeaderJson
    | tree.SnapshotJson
    | samples.StepJson
    | tree.ForensicsJson
    | samples.SampleJson
    | samples.GpuSampleJson
    | samples.RuleBrokenJson
)
#: An event as ``artifact.events`` keeps it: not the samples, header, snapshot and steps
#: (sections of their own hold them), and a forensics event as a mention.
KeptEventJson = _KeptAsIs | tree.ForensicsMentionJson


Owner = TypeVar("Owner")
#: A fold's handler of one kind: ``(the fold, t, the event's JSON form)``.  The event is typed
#: ``Any`` here so each handler names its own kind's TypedDict (``tests/test_event_json.py``
#: checks that every handler takes the kinds it is registered for).
Handler = Callable[[Owner, float, Any], None]
AnyHandler = TypeVar("AnyHandler", bound=Callable[..., None])


class EventFold(Generic[Owner]):
    """A fold's handlers (``@_fold.on(EventKind.STARTED)``), one per kind it reads, each reading
    its kind's TypedDict (``.get`` for keys other versions may lack); other kinds are ignored.
    """

    __slots__ = ("handlers",)

    def __init__(self) -> None:
        self.handlers: dict[str, Handler[Owner]] = {}

    def on(self, *kinds: EventKind) -> Callable[[AnyHandler], AnyHandler]:
        """Register the decorated method as the handler of ``kinds``."""

        def register(handler: AnyHandler) -> AnyHandler:
            for kind in kinds:
                if kind in self.handlers:
                    raise ValueError(f"two handlers of {kind!r} events")
                self.handlers[kind] = handler
            return handler

        return register

    def dispatch(self, owner: Owner, event: Mapping[str, Any]) -> bool:
        """Fold ``event`` into ``owner``; False when no handler reads its kind."""
        kind = event.get("kind")
        handler = self.handlers.get(kind) if isinstance(kind, str) else None
        if handler is None:
            return False
        handler(owner, float(event.get("t") or 0.0), event)
        return True


def event_to_json(event: Event) -> EventJson:
    """The one JSON form of an event: ``{"t": ..., "kind": ..., **fields}``."""
    global _again_before, _again_now
    if _again_now:  # the previous event held instances given again: theirs are kept one more
        _again_before, _again_now = _again_now, {}
    out: dict[str, Any] = {"t": round(event.t, 6), "kind": event.KIND}
    for name in event.FIELDS[1:]:
        out[name] = _plain(getattr(event, name))
    # Sound: tests/test_event_json.py holds each class's fields to its kind's TypedDict.
    return cast(EventJson, out)


#: Field names of each dataclass met, and whether it has ``JSON_AGAIN``: ``dataclasses.fields()``
#: builds a new tuple at every call, and a sample of a large tree holds a dataclass per process,
#: every sample.
_DATACLASSES: dict[type, tuple[tuple[str, ...], bool]] = {}
#: The JSON forms of instances of classes with ``JSON_AGAIN`` (a sleeping process's figures,
#: the same object sample after sample; never changed once built), id -> (instance, form):
#: those of the last event that held any, and of the one before.  Read-only once made.
_again_before: dict[int, tuple[Any, dict[str, Any]]] = {}
_again_now: dict[int, tuple[Any, dict[str, Any]]] = {}
#: Types returned as they are, checked first: they are most of what a sample holds.
_AS_IS = frozenset({int, str, bool, type(None)})


def _plain(value: Any) -> Any:
    cls = type(value)
    if cls in _AS_IS:
        return value
    if cls is float:
        return None if value != value else value  # NaN: the artifact is allow_nan=False
    # Inside containers, values of the types kept as they are skip the call: a sample holds a
    # dataclass per process, and most of their fields are ints and strings.
    dataclass = _DATACLASSES.get(cls)
    if dataclass is None and is_dataclass(cls):  # an instance: a class's type never is one
        names = tuple(f.name for f in fields(cls))
        dataclass = _DATACLASSES[cls] = (names, bool(getattr(cls, "JSON_AGAIN", False)))
    if dataclass is not None:
        names, again = dataclass
        if again:
            key = id(value)
            known = _again_before.get(key) or _again_now.get(key)
            if known is not None and known[0] is value:
                _again_now[key] = known
                return known[1]
        out = {}
        for name in names:
            field = getattr(value, name)
            kind = type(field)
            if kind in _AS_IS:
                out[name] = field
            elif kind is float:
                out[name] = None if field != field else field
            else:
                out[name] = _plain(field)
        if again:
            _again_now[key] = (value, out)
        return out
    if isinstance(value, Mapping):
        return {str(k): v if type(v) in _AS_IS else _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | frozenset | set):
        items = [v if type(v) in _AS_IS else _plain(v) for v in value]
        return sorted(items) if isinstance(value, frozenset | set) else items
    if isinstance(value, float) and value != value:
        return None
    return value

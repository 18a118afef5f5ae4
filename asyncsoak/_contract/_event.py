"""What every event is: a small immutable record with a ``KIND`` tag and ``t``, seconds since
the soak's start.  Its class declares fields as a dataclass does, but is a plain slotted class:
29 frozen dataclasses cost ~18 ms of every start-up.
"""

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol, TypedDict, dataclass_transform, runtime_checkable

#: A series group (``"tree"``, ``"machine"``, ``"gpu0"``) to field name to value.
SeriesPoints = Mapping[str, Mapping[str, float | None]]
#: A summary group to label name to values seen (``{"gpu0": {"throttle_reasons": [...]}}``).
SummaryLabels = Mapping[str, Mapping[str, list[str]]]


@runtime_checkable
class SeriesSource(Protocol):
    """A sample that contributes to the artifact's ``series`` and ``summary``."""

    t: float

    def series_points(self) -> SeriesPoints: ...

    def summary_labels(self) -> SummaryLabels: ...


@dataclass_transform(frozen_default=True)
class _EventClass(type):
    """Makes each annotated name of the body (not a ``ClassVar``) a slot and a field; a value
    given there is its default (a dict or list one copied for each event)."""

    FIELDS: tuple[str, ...]
    DEFAULTS: dict[str, Any]

    def __new__(
        mcs, name: str, bases: tuple[type, ...], body: dict[str, Any], **kind: Any
    ) -> "_EventClass":
        own = [k for k, v in body.get("__annotations__", {}).items() if "ClassVar" not in str(v)]
        defaults = {k: body.pop(k) for k in own if k in body}
        cls = super().__new__(mcs, name, bases, {**body, "__slots__": tuple(own)}, **kind)
        cls.FIELDS = (*getattr(cls, "FIELDS", ()), *own)
        cls.DEFAULTS = {**getattr(cls, "DEFAULTS", {}), **defaults}
        return cls


class Event(metaclass=_EventClass):
    """Base of every event: ``t`` is seconds since the soak started."""

    KIND: ClassVar[str] = "event"
    #: Samples may be dropped under back-pressure; other events never are.
    DROPPABLE: ClassVar[bool] = False
    #: The fields in order (``t`` first), and the defaults of those that have one.
    FIELDS: ClassVar[tuple[str, ...]]
    DEFAULTS: ClassVar[dict[str, Any]]

    t: float

    def __init_subclass__(cls, kind: str = "", **kwargs: Any) -> None:
        """``class Started(Event, kind=EventKind.STARTED)`` sets its ``KIND``."""
        super().__init_subclass__(**kwargs)
        if kind:
            cls.KIND = kind

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        given = dict(zip(self.FIELDS, args, strict=False)) | kwargs
        if len(args) > len(self.FIELDS) or given.keys() - set(self.FIELDS):
            raise TypeError(f"{type(self).__name__}() takes only {', '.join(self.FIELDS)}")
        for name in self.FIELDS:
            if name in given:
                value = given[name]
            elif name in self.DEFAULTS:
                value = self.DEFAULTS[name]
                value = value.copy() if type(value) in (dict, list) else value
            else:
                raise TypeError(f"{type(self).__name__}() needs {name}")
            object.__setattr__(self, name, value)

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.FIELDS)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.FIELDS)
        return f"{type(self).__name__}({shown})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: events are immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}: events are immutable")


class EventJsonBase(TypedDict):
    """What every event's JSON form holds (each kind's adds ``kind`` and its fields).  Words of
    the vocabulary are ``str`` (a journal's are); a field with a default is ``NotRequired``
    (older journals lack it)."""

    t: float

"""Metric families in Prometheus' two exposition formats: the text format 0.0.4 and
OpenMetrics 1.0.0.

The soak's and the worker's metrics are plain rows (:data:`Row`): a family's name, type and
help, and its samples.  :func:`encode_rows` writes them as ``prometheus_client``'s
``generate_latest`` would, without needing ``prometheus_client`` (the ``metrics`` extra): a
soak's textfile and its ``/metrics`` page cost no validation of names chosen once.
:func:`families` and :func:`rows_of` convert to and from ``prometheus_client``'s families, for a
registry of its own (the queue worker's) and for the tests that hold the two writers equal.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

#: A sample: its name, its labels sorted by name, its value.
Sample = tuple[str, tuple[tuple[str, str], ...], float]
#: A family: its name, type and help, and its samples.
Row = tuple[str, str, str, list[Sample]]


def families(rows: Iterable[Row]) -> Iterator[Metric]:
    """Rows as ``prometheus_client`` metric families."""
    from prometheus_client.metrics_core import Metric

    for name, kind, help_text, samples in rows:
        family = Metric(name, help_text, kind)
        for sample_name, labels, value in samples:
            family.add_sample(sample_name, dict(labels), value)
        yield family


def new_registry(*collectors: Any) -> CollectorRegistry:
    from prometheus_client.registry import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return registry


#: The media types of the two formats (OpenMetrics 1.0.0, Prometheus text 0.0.4).
OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def wants_openmetrics(accept: str) -> bool:
    """Whether an ``Accept`` header asks for OpenMetrics (Prometheus' does, first)."""
    for media in accept.split(","):
        kind, _, params = media.partition(";")
        if kind.strip() == "application/openmetrics-text":
            version = next(
                (p.split("=", 1)[1].strip() for p in params.split(";") if "version=" in p), ""
            )
            if version in ("", "1.0.0", "0.0.1"):
                return True
    return False


def render(registry: CollectorRegistry, accept: str = "") -> tuple[bytes, str]:
    """A registry's scrape: the body and content type, OpenMetrics when ``accept`` asks."""
    return render_rows(rows_of(registry.collect()), accept)


def render_rows(rows: Iterable[Row], accept: str = "") -> tuple[bytes, str]:
    """Rows' scrape: the body and content type, OpenMetrics when ``accept`` asks."""
    if wants_openmetrics(accept):
        return encode_rows(rows, openmetrics=True), OPENMETRICS_TYPE
    return encode_rows(rows, openmetrics=False), TEXT_TYPE


def rows_of(families: Iterable[Metric]) -> Iterator[Row]:
    """``prometheus_client`` families (any collector's) as rows."""
    for family in families:
        samples = [(s.name, tuple(sorted(s.labels.items())), s.value) for s in family.samples]
        yield family.name, family.type, family.documentation, samples


def encode_rows(rows: Iterable[Row], *, openmetrics: bool) -> bytes:
    """Rows in either format, exactly as ``prometheus_client``'s ``generate_latest`` writes them.

    A writer of its own because a scrape every second is paid from the monitor's budget:
    ``generate_latest`` validates and escapes every metric and label name at every sample
    (names asyncsoak chose once, valid by construction), several times the cost of the rest.
    From one scrape to the next most families say the same (the phase, the limits, the
    throttle reasons) and the others change only their values, so each family's text is kept
    with the samples it was written from and reused while they are equal, and each sample's
    name and labels are formatted once (label sets are bounded, and so are the caches).  A
    test holds the output byte for byte to ``generate_latest``'s.
    """
    if len(_LINE_CACHE) > _CACHE_MAX:
        _LINE_CACHE.clear()
    if len(_FAMILY_CACHE) > _CACHE_MAX:
        _FAMILY_CACHE.clear()
    out: list[str] = []
    for name, kind, help_text, samples in rows:
        key = (name, kind, help_text, openmetrics)
        cached = _FAMILY_CACHE.get(key)
        if cached is not None and cached[0] == samples:
            out.append(cached[1])
            continue
        lines = [_header(name, kind, help_text, openmetrics)]
        for sample_name, labels, value in samples:
            line = (sample_name, labels)
            prefix = _LINE_CACHE.get(line)
            if prefix is None:
                prefix = _LINE_CACHE[line] = _prefix(sample_name, labels)
            lines.append(f"{prefix}{_go_float(value)}\n")
        text = "".join(lines)
        _FAMILY_CACHE[key] = (list(samples), text)
        out.append(text)
    if openmetrics:
        out.append("# EOF\n")
    return "".join(out).encode()


#: See ``encode_rows``; each is cleared past ``_CACHE_MAX`` entries.
_LINE_CACHE: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
_FAMILY_CACHE: dict[tuple[str, str, str, bool], tuple[list[Sample], str]] = {}
_CACHE_MAX = 4096


def _header(name: str, kind: str, help_text: str, openmetrics: bool) -> str:
    if not openmetrics:
        if kind == "counter":
            name += "_total"
        elif kind == "info":
            name, kind = name + "_info", "gauge"
        elif kind == "unknown":
            kind = "untyped"
    return f"# HELP {name} {_escape_help(help_text, openmetrics)}\n# TYPE {name} {kind}\n"


def _prefix(sample_name: str, labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return sample_name + " "
    pairs = ",".join(f'{key}="{_escape_label(text)}"' for key, text in labels)
    return f"{sample_name}{{{pairs}}} "


def _go_float(value: float) -> str:
    """A value as Go (and ``prometheus_client``) writes it: ``+Inf``, ``1.5e+09``."""
    number = float(value)
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    if math.isnan(number):
        return "NaN"
    text = repr(number)
    dot = text.find(".")
    # Go switches to exponents sooner than Python.
    if number > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _escape_label(text: str) -> str:
    if "\\" in text or "\n" in text or '"' in text:
        return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return text


def _escape_help(text: str, openmetrics: bool) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if openmetrics else text


def metric_names(families: Iterable[Metric]) -> set[str]:
    """The sample names a list of families shows (``_total``, ``_info`` included)."""
    return {sample.name for family in families for sample in family.samples}

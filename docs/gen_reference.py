"""The reference pages, generated from the code at every build so they cannot drift from it.

A mkdocs hook (``hooks:`` in ``mkdocs.yml``): ``on_files`` adds ``reference/*.md``, written
from the command line's argparse parsers, the artifact's JSON Schema, the vocabularies of
``asyncsoak._contract._vocabulary``, the exported metrics and ``asyncsoak.__all__``.  Nothing is
fetched.  A reason code without a title for people is logged as a warning, which
``mkdocs build --strict`` turns into a failed build.

``python docs/gen_reference.py DIR`` writes the same pages into ``DIR`` (to read them
without building the site).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.plugins.asyncsoak_reference")


def cli_reference() -> str:
    """Every subcommand's usage and options, as ``asyncsoak COMMAND --help`` prints them."""
    from asyncsoak.cli import build_parser

    parser = build_parser()
    lines = [
        "# Command line",
        "",
        "Generated from the command line's own parsers: what `asyncsoak COMMAND --help` prints.",
        "Exit statuses are in [Reason codes and exit statuses](reasons.md).",
        "",
        "```text",
        _help(parser),
        "```",
    ]
    for name, sub in _subcommands(parser):
        lines += ["", f"## `asyncsoak {name}`", "", "```text", _help(sub), "```"]
    return "\n".join(lines) + "\n"


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def _help(parser: argparse.ArgumentParser) -> str:
    # A fixed width (argparse reads COLUMNS), so the page is the same whatever built it.
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        return parser.format_help().rstrip()
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def reasons_reference() -> str:
    """The statuses, the failure reasons with their titles, stop causes, exit statuses."""
    from asyncsoak._contract._vocabulary import FailureReason, SoakStatus, StopCause
    from asyncsoak._contract.exits import EXIT_FAILED, EXIT_PASSED, EXIT_USAGE
    from asyncsoak._view._summary import REASON_TITLES, STATUS_HEADLINES
    from asyncsoak.cli._run import STOP_SIGNALS

    lines = [
        "# Reason codes and exit statuses",
        "",
        "Generated from `asyncsoak._contract._vocabulary` (the words the artifact and the journal",
        "use), the views' titles and the command line's exit statuses.",
        "",
        "## Statuses (`status`)",
        "",
        "| status | headline |",
        "| --- | --- |",
    ]
    for status in SoakStatus:
        lines.append(f"| `{status}` | {STATUS_HEADLINES.get(status, '')} |")
    lines += [
        "",
        "The views and `summary --json` call a `passed` run that carries warnings",
        "`passed_with_warnings` (the report's badge says PASSED WITH WARNINGS, in amber); the",
        "artifact's `status` stays `passed`.",
        "",
        "## Failure reasons (`failures[].reason`)",
        "",
        "What each rule means and when it fires: [How a run is judged](../judging.md).",
        "",
    ]
    detailed = _detailed_exit_codes()
    if detailed is None:
        lines += ["| reason | what the views say |", "| --- | --- |"]
    else:
        lines += [
            "| reason | what the views say | exit status with `--detailed-exit-codes` |",
            "| --- | --- | --- |",
        ]
    for reason in FailureReason:
        title = REASON_TITLES.get(reason)
        if title is None:
            log.warning("reason code %r has no title in asyncsoak._view._summary", str(reason))
        row = f"| `{reason}` | {title or ''} |"
        if detailed is not None:
            if reason not in detailed:
                log.warning("reason code %r has no detailed exit status", str(reason))
            row += f" {detailed.get(reason, '')} |"
        lines.append(row)
    lines += ["", "## Stop causes (`stop.cause`)", "", ""]
    lines.append(", ".join(f"`{cause}`" for cause in StopCause) + ".")
    lines += [
        "",
        "## Exit statuses of `asyncsoak run`",
        "",
        "| exit status | meaning |",
        "| --- | --- |",
        f"| {EXIT_PASSED} | the soak passed |",
        f"| {EXIT_FAILED} | the soak failed, or the monitor itself failed (`monitor_error`) |",
        f"| {EXIT_USAGE} | bad usage or input: nothing was launched or written |",
    ]
    for signum in sorted(STOP_SIGNALS):
        name = signal.Signals(signum).name
        lines.append(
            f"| {128 + signum} | the monitor got {name}: the tree was stopped, "
            "the artifact says `cancelled` |"
        )
    return "\n".join(lines) + "\n"


def _detailed_exit_codes() -> Mapping[str, int] | None:
    """Each reason's exit status under ``--detailed-exit-codes``, where this asyncsoak has
    that flag (``asyncsoak._contract._exit_codes``)."""
    if importlib.util.find_spec("asyncsoak._contract._exit_codes") is None:
        return None
    codes: Mapping[str, int] = importlib.import_module(
        "asyncsoak._contract._exit_codes"
    ).DETAILED_EXIT_CODES
    return codes


def schema_reference() -> str:
    """Every key of the artifact, from its JSON Schema, and the schema itself."""
    from asyncsoak.artifact import SCHEMA_VERSION, schema

    document = schema()
    lines = [
        "# Artifact schema",
        "",
        f"Generated from `asyncsoak/artifact.schema.json` (schema version {SCHEMA_VERSION}):",
        f"{document.get('description', '')}",
        "What the keys mean: [The artifact](../artifact.md).",
        "",
        "| key | type | required |",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| `{key}` | {kind} | {'yes' if required else ''} |"
        for key, kind, required in _keys(document, document)
    ]
    lines += [
        "",
        '??? note "The JSON Schema"',
        "",
        "    ```json",
        *("    " + line for line in json.dumps(document, indent=2).splitlines()),
        "    ```",
    ]
    return "\n".join(lines) + "\n"


def _keys(
    node: Mapping[str, Any], root: Mapping[str, Any], prefix: str = "", depth: int = 0
) -> Iterator[tuple[str, str, bool]]:
    """(dotted key, type, required) of an object's properties, two levels deep."""
    required = set(node.get("required", ()))
    for key, child in node.get("properties", {}).items():
        child = _resolve(child, root)
        name = f"{prefix}{key}"
        yield name, _type_of(child, root), key in required
        items = _resolve(child.get("items", {}), root)
        if depth < 1 and "properties" in child:
            yield from _keys(child, root, f"{name}.", depth + 1)
        elif depth < 1 and "properties" in items:
            yield from _keys(items, root, f"{name}[].", depth + 1)


def _resolve(node: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        resolved: Mapping[str, Any] = root["$defs"][ref.removeprefix("#/$defs/")]
        return resolved
    return node


def _type_of(node: Mapping[str, Any], root: Mapping[str, Any]) -> str:
    if "enum" in node:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    kind = node.get("type")
    if isinstance(kind, list):
        return " or ".join(str(k) for k in kind)
    if kind == "array":
        return f"array of {_type_of(_resolve(node.get('items', {}), root), root)}"
    if kind is None and "anyOf" in node:
        return " or ".join(_type_of(_resolve(n, root), root) for n in node["anyOf"])
    return str(kind or "any")


def metrics_reference() -> str:
    """Every metric a soak and a worker export, with its type and help, from a scrape."""
    from asyncsoak._export._soak_metrics import METRIC_NAMES

    families = {name: (kind, text, labels) for name, kind, text, labels in _scraped_families()}
    lines = [
        "# Metrics",
        "",
        "Generated from what a soak's and a worker's endpoints export (a scrape of each, made",
        "at build time from recorded events). How to scrape them and the alert rules:",
        "[Live metrics](../metrics.md).",
        "",
        "| metric | type | labels | help |",
        "| --- | --- | --- | --- |",
    ]
    for name in sorted(METRIC_NAMES):
        if name not in families:
            log.warning("metric %s is in METRIC_NAMES but no scrape exports it", name)
        kind, text, labels = families.get(name, ("", "", ()))
        shown = ", ".join(f"`{label}`" for label in labels)
        escaped = text.replace("|", "\\|")
        lines.append(f"| `{name}` | {kind} | {shown} | {escaped} |")
    return "\n".join(lines) + "\n"


def _scraped_families() -> Iterator[tuple[str, str, str, tuple[str, ...]]]:
    """(sample name, type, help, labels) of every family a busy soak and worker export."""
    from asyncsoak._export._metrics import WorkerMetrics, new_registry
    from asyncsoak._export._soak_metrics import SoakMetrics

    # One soak running (its live gauges), one finished (its verdict).
    running = SoakMetrics("1-2", now=lambda: 100.0, host="node")
    finished = SoakMetrics("1-3", now=lambda: 100.0, host="node")
    trend = {"slope_per_hour": 3.6e9, "projected_limit_at": "2026-01-01T02:00:00Z"}
    for soak in (running, finished):
        for event in _busy_soak_events():
            soak.observe(event)
        soak.observe_trends({"tree.anon_bytes": trend, "tree.rss_bytes": trend})
    finished.observe({"t": 4.0, "kind": "finished", "status": "passed"})
    worker = WorkerMetrics("node:gpu0", host="node", heartbeat_at=1.7e9)
    worker.current_job, worker.current_attempt = 1, 1
    worker.queue_jobs = {"queued": 1}
    worker.outcome("failed", "stale_progress")
    for registry in (new_registry(running), new_registry(finished), new_registry(worker)):
        for family in registry.collect():
            labels: dict[str, None] = {}
            for sample in family.samples:
                labels.update(dict.fromkeys(sample.labels))
            names = {sample.name for sample in family.samples} or {family.name}
            for name in names:
                yield name, family.type, family.documentation, tuple(labels)


def _busy_soak_events() -> list[dict[str, Any]]:
    """A soak's journal in brief: the header, its start, progress, samples of a tree and a
    GPU, and its end, so every family of the soak has a sample."""
    return [
        {
            "t": 0.0,
            "kind": "header",
            "monotonic_start": 0.0,
            "started_at": "2026-01-01T00:00:00Z",
            "config": {"stale_progress_seconds": 120, "startup_timeout_seconds": 600},
            "command": ["python", "train.py"],
            "metadata": {"job_id": 1},
        },
        {"t": 0.1, "kind": "started", "pid": 10},
        {"t": 1.0, "kind": "progress", "changed": 1},
        {
            "t": 2.0,
            "kind": "sample",
            # A rank (torchrun's worker) and its data-loader worker, which inherits its rank.
            "processes": [
                {"pid": 11, "cmdline": ["python", "train.py"], "role": {"rank": 0}},
                {"pid": 12, "cmdline": ["python", "train.py"], "role": {"rank": 0}},
            ],
            "points": {
                "tree": {
                    "processes": 2,
                    "threads": 8,
                    "fds": 12,
                    "cpu_percent": 150.0,
                    "rss_bytes": 2**30,
                    "anon_bytes": 2**29,
                }
            },
        },
        {
            "t": 2.0,
            "kind": "gpu_sample",
            "gpus": [
                {
                    "index": 0,
                    "uuid": "GPU-0",
                    "utilization_gpu_percent": 90.0,
                    "memory_used_mib": 1000.0,
                    "power_draw_w": 300.0,
                    "temperature_gpu_c": 60.0,
                    "clock_event_reasons": ["sw_thermal"],
                }
            ],
            "processes": [
                {"pid": 10, "gpu_index": 0, "in_tree": True, "used_gpu_memory_mib": 500.0}
            ],
        },
        {
            "t": 2.5,
            "kind": "gpu_fault",
            "fault": "xid",
            "gpu": 0,
            "uuid": "GPU-0",
            "xid": 79,
            "fails": True,
        },
        {"t": 3.0, "kind": "sampler_degraded", "sampler": "gpu", "message": "slow"},
    ]


def api_reference() -> str:
    """The public names, each by mkdocstrings, in ``__all__``'s order; then the read side
    and the trainer's side."""
    import asyncsoak

    lines = [
        "# Python API",
        "",
        "The public names of `asyncsoak` (its `__all__`), then `asyncsoak.artifact` (reading",
        "artifacts and journals) and `asyncsoak.trainer` (the trainer's side of the queue).",
        "",
    ]
    for name in asyncsoak.__all__:
        lines += [f"::: asyncsoak.{name}", "    options:", "      show_root_heading: true", ""]
    for module in ("asyncsoak.artifact", "asyncsoak.trainer"):
        lines += [f"::: {module}", "    options:", "      show_root_heading: true", ""]
    return "\n".join(lines)


PAGES = {
    "reference/cli.md": cli_reference,
    "reference/artifact.md": schema_reference,
    "reference/reasons.md": reasons_reference,
    "reference/metrics.md": metrics_reference,
    "reference/api.md": api_reference,
}


#: ``<!-- usage: run -->`` in a page: the usage of those subcommands, from their parsers.
USAGE = re.compile(r"^<!-- usage: ([a-z ]+) -->$", re.M)


def usage_block(match: re.Match[str]) -> str:
    """A fenced block of the named subcommands' usage lines, as ``--help`` begins."""
    from asyncsoak.cli import build_parser

    subcommands = dict(_subcommands(build_parser()))
    usages = []
    for name in match.group(1).split():
        first, *rest = _help(subcommands[name]).split("\n\n", 1)[0].splitlines()
        # Without argparse's "usage: ", its continuation lines dedented to match.
        prefix = len("usage: ")
        usages.append(first[prefix:])
        usages.extend(line[prefix:] if line[:prefix].isspace() else line for line in rest)
    return "```text\n" + "\n".join(usages) + "\n```"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs' hook: each ``<!-- usage: ... -->`` replaced by the usage it names."""
    return USAGE.sub(usage_block, markdown)


def on_files(files: Any, config: Any) -> Any:
    """mkdocs' hook: the reference pages added to the site's files."""
    from mkdocs.structure.files import File

    for path, page in PAGES.items():
        files.append(File.generated(config, path, content=page()))
    return files


if __name__ == "__main__":
    out = Path(sys.argv[1])
    for path, page in PAGES.items():
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text(page())

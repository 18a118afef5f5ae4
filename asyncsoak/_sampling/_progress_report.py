"""What the watchdog tells: progress and step events, notes of a missing progress directory
and warnings of unreadable ones, and the final scan once the command has exited."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import anyio

from .._contract import BlockingCallTimeout, EventSink, events, run_blocking
from ._progress_rules import ProgressTracker
from ._progress_scan import FileKey, Scanner, ScanResult, path_matches
from ._step_files import StepReading
from ._steps import StepReader

#: How many changed paths a progress event names.
PATHS_PER_EVENT = 5
#: How many step marks a step event carries (the newest): a scan that read more (a trainer
#: far faster than the scans, or a backlog) gives the ledger only its newest steps.
MARKS_PER_EVENT = 256


async def report_progress(
    sink: EventSink,
    tracker: ProgressTracker,
    changed: list[str],
    now: float,
    previous: float | None,
    stale_limit: float | None = None,
) -> None:
    """A ``progress`` event for the paths the tracker's last observation found changed."""
    if changed:
        gap = None if previous is None else now - previous
        await sink.emit(
            events.Progress(
                t=now,
                changed=len(changed),
                paths=named_paths(changed, tracker.named_globs),
                gap_seconds=gap,
                grown_bytes=tracker.grown_bytes,
                rank_grown_bytes=dict(tracker.rank_grown_bytes),
                stale_limit_seconds=stale_limit,
            )
        )


def named_paths(changed: list[str], globs: Collection[str]) -> list[str]:
    """The paths a progress event names: the first :data:`PATHS_PER_EVENT`, and the first
    match of each GLOB they leave out (``--expect-every``'s, ``--checkpoint-glob``'s), so that
    the deadline and the goodput ledger see it."""
    named = changed[:PATHS_PER_EVENT]
    for glob in globs:
        if not any(path_matches(glob, path) for path in named):
            named += [path for path in changed if path_matches(glob, path)][:1]
    return named


async def note_missing_dir(
    sink: EventSink, tracker: ProgressTracker, progress_dir: Path, *, missing: bool
) -> None:
    """Tell (a ``sampler_note``, which the live line shows) when the progress directory is
    found missing, or found created after that."""
    if missing == (tracker.missing_dir is not None):
        return
    tracker.missing_dir = progress_dir if missing else None
    message = f"the progress directory {progress_dir} " + (
        "does not exist (yet)" if missing else "was created"
    )
    data = {"progress_dir": str(progress_dir), "exists": not missing}
    await sink.emit(
        events.SamplerNote(t=sink.elapsed(), sampler="watchdog", message=message, data=data)
    )


def skipped_message(progress_dir: Path, result: ScanResult) -> str:
    return (
        f"{result.errors} director{'y' if result.errors == 1 else 'ies'} below {progress_dir} "
        "could not be read and were skipped (their files are not watched for progress)"
    )


async def final_scan(
    sink: EventSink,
    *,
    progress_dir: Path,
    tracker: ProgressTracker,
    ignore: Collection[FileKey],
    also: Collection[Path] = (),
    limiter: anyio.CapacityLimiter,
    scan_timeout: float,
    steps: StepReader | None = None,
) -> tuple[str, str] | None:
    """One last scan when the command has exited: what it wrote since the last scan counts,
    even when it lived less than one scan interval (its last steps too).  Returns the rule
    its last steps broke (a non-finite loss), if any."""
    previous = tracker.last_change
    # A scan of the watchdog's still stuck holds the step reader: not waited for long.
    scan = Scanner(progress_dir, lambda: ignore, also, steps, wait=scan_timeout / 2)
    try:
        result = await run_blocking(
            scan,
            timeout=scan_timeout,
            what="the final scan of the progress dir",
            limiter=limiter,
        )
    except BlockingCallTimeout:
        return None
    now = sink.elapsed()
    await note_missing_dir(sink, tracker, progress_dir, missing=result.missing)
    await report_progress(sink, tracker, tracker.observe(result.files, now), now, previous)
    if result.steps is not None and tracker.steps is not None:
        return await report_steps(sink, tracker, result.steps, now)
    return None


#: Notes about the step sources (garbage, a step going back, a skipped backlog) a soak
#: records at most; the rest are counted in the last one.
STEP_NOTES_MAX = 20


def auto_limit(tracker: ProgressTracker, steps: bool) -> float | None:
    """The learned limit to record with a progress (``steps``: a step) event, if auto."""
    if tracker.auto is None or tracker.stepping() != steps:
        return None
    return round(tracker.auto.limit, 3)


async def report_steps(
    sink: EventSink, tracker: ProgressTracker, reading: StepReading, now: float
) -> tuple[str, str] | None:
    """Fold and emit what the step sources wrote; a non-finite loss under
    ``--loss-check fail`` is returned as the rule it broke."""
    steps = tracker.steps
    assert steps is not None
    update = tracker.observe_steps(reading, now)
    for note in update.notes:
        tracker.step_notes += 1
        if tracker.step_notes < STEP_NOTES_MAX:
            await sink.emit(events.SamplerNote(t=now, sampler="steps", message=note))
        elif tracker.step_notes == STEP_NOTES_MAX:
            message = f"{note} (and no further notes about the step sources)"
            await sink.emit(events.SamplerNote(t=now, sampler="steps", message=message))
    for warning in update.warnings:
        await sink.emit(events.WarningEvent(t=now, message=warning))
    if (update.advanced or update.changed) and steps.step is not None:
        assert steps.source is not None
        assert steps.source_kind is not None
        await sink.emit(
            events.StepProgress(
                t=now,
                step=steps.step,
                source=steps.source,
                source_kind=steps.source_kind,
                gap_seconds=update.gap,
                max_steps=steps.max_steps,
                loss=steps.loss,
                loss_step=steps.loss_step,
                nonfinite_loss=steps.nonfinite_loss,
                steps_per_second=_rounded(steps.steps_per_second),
                tokens_per_second=_rounded(steps.tokens_per_second),
                samples_per_second=_rounded(steps.samples_per_second),
                eta_seconds=_rounded(steps.eta_seconds()),
                stale_limit_seconds=auto_limit(tracker, True),
                counts=tracker.stepping(),
                nonfinite_grad_norms=steps.nonfinite_grad_norms,
                sources_without_loss=tuple(steps.sources_without_loss()),
                marks=tuple(update.marks[-MARKS_PER_EVENT:]),
            )
        )
    if update.nonfinite is not None:
        if steps.loss_check == "fail":
            return ("nonfinite_loss", f"{update.nonfinite} (loss_check=fail)")
        await sink.emit(events.WarningEvent(t=now, message=update.nonfinite))
    return None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)

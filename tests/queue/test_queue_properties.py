"""Properties of a job's final status over its whole input space: the table of DESIGN.md's
"Final status", read row by row, and the rule that combines it with the soak's verdict."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from asyncsoak.queue import final_status, with_soak_verdict
from asyncsoak.trainer import EXIT_INTERRUPTED

STATUSES = ("succeeded", "failed", "cancelled", "interrupted")

#: Exit statuses: unknown, success, the interrupted protocol's, and any other integer
#: (negative for signals); each kind is drawn as often as the others.
exit_statuses = st.one_of(st.none(), st.just(0), st.just(EXIT_INTERRUPTED), st.integers())
#: Every combination of (cancel_requested, stopping, killed): few enough to try them all.
FLAGS = list(itertools.product((False, True), repeat=3))


def table_rows(rc: int | None, cancel_requested: bool, stopping: bool, killed: bool) -> set[str]:
    """The statuses of every row of the "Final status" table (DESIGN.md) that matches
    ("other": none of the statuses named above it, 0, 4 or None)."""
    other = rc not in (0, EXIT_INTERRUPTED, None)
    rows = [
        (rc == 0, "succeeded"),
        (rc != 0 and cancel_requested, "cancelled"),
        (rc == EXIT_INTERRUPTED and not cancel_requested and not killed, "interrupted"),
        (rc not in (0, None) and not cancel_requested and stopping and killed, "interrupted"),
        (rc is None and not cancel_requested and not stopping, "failed"),
        (other and not cancel_requested and not stopping, "failed"),
    ]
    return {status for matches, status in rows if matches}


@given(rc=exit_statuses)
def test_final_status_follows_the_table_and_fails_closed(rc: int | None) -> None:
    """Rows that match agree and give the status; a case no row lists fails."""
    for cancel, stopping, killed in FLAGS:
        rows = table_rows(rc, cancel, stopping, killed)
        assert len(rows) <= 1, f"the table is ambiguous here: {rows}"
        expected = rows.pop() if rows else "failed"
        assert final_status(rc, cancel, stopping, killed) == expected, (cancel, stopping, killed)


@given(status=st.sampled_from(STATUSES), soak_failed=st.booleans())
def test_soak_verdict_turns_only_succeeded_and_failed_into_failed(
    status: str, soak_failed: bool
) -> None:
    """A soak failure makes succeeded or failed into failed; cancelled and interrupted stay."""
    expected = "failed" if soak_failed and status in ("succeeded", "failed") else status
    assert with_soak_verdict(status, soak_failed) == expected


@given(rc=exit_statuses, soak_failed=st.booleans())
def test_combined_status_never_passes_a_failed_soak_nor_fails_a_stop(
    rc: int | None, soak_failed: bool
) -> None:
    """Combined with a failed soak, no job succeeds; a cancelled or interrupted attempt keeps
    its status whatever the soak decided."""
    for cancel, stopping, killed in FLAGS:
        alone = final_status(rc, cancel, stopping, killed)
        combined = with_soak_verdict(alone, soak_failed)
        assert combined in STATUSES
        if soak_failed:
            assert combined != "succeeded"
        if alone in ("cancelled", "interrupted") or not soak_failed:
            assert combined == alone

"""A standing fuzz suite: the journal decoder, the artifact loader and the command line's
argument parsing over hostile input.  Each property holds for any input hypothesis finds; the
whole file runs in well under a minute."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncsoak import artifact
from asyncsoak._contract._bounded import UnreadableFileError, nested_too_deep
from asyncsoak._record._journal import JournalDecoder
from asyncsoak.cli import UsageError, build_parser
from asyncsoak.cli._run import check_run_flags

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([3_000_000_000, -1, 0, 2**63])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
#: Patches as the decoder reads them, shaped by hand: the encoder's keys with any values.
patches = st.recursive(
    scalars,
    lambda inner: (
        st.fixed_dictionaries({"=": inner})
        | st.fixed_dictionaries(
            {},
            optional={
                "{": st.dictionaries(st.sampled_from(["a", "b", "points"]), inner, max_size=3),
                "-": st.lists(st.sampled_from(["a", "b", "points"]), max_size=2),
            },
        )
        | st.fixed_dictionaries(
            {"[": st.lists(st.tuples(scalars, inner).map(list), max_size=3), "n": scalars}
        )
        | st.lists(inner, max_size=3)
    ),
    max_leaves=12,
)
events = st.fixed_dictionaries(
    {"t": scalars, "kind": st.sampled_from(["sample", "gpu_sample", "header", "x"])},
    optional={"~": patches, "a": patches, "points": patches},
)
lines = (
    events.map(lambda e: json.dumps(e).encode())
    | st.binary(max_size=64)
    | st.integers(1, 3000).map(
        lambda depth: b'{"kind":"x","a":' + b"[" * depth + b"]" * depth + b"}"
    )
)


@pytest.mark.slow
@FAST
@given(st.lists(lines, max_size=12))
def test_the_journal_decoder_is_bounded_on_any_lines(raw: list[bytes]) -> None:
    """Any line gives an event, None, or UnreadableFileError, never another exception; no
    event is more than a few times the bytes fed so far, nor nested past the bound."""
    decoder = JournalDecoder()
    fed = 0
    for line in raw:
        fed += len(line)
        try:
            event = decoder.decode(line)
        except UnreadableFileError:
            continue
        if event is None:
            continue
        assert isinstance(event, dict)
        size = len(json.dumps(event, separators=(",", ":"), default=str))
        assert size <= 4 * fed + 64, (size, fed)
        assert not nested_too_deep(event)


def artifact_like(values: Any) -> dict[str, Any]:
    return {"schema_version": 2, "status": "passed", "extra": values}


files = (
    st.binary(max_size=200)
    | patches.map(lambda v: json.dumps(artifact_like(v)).encode())
    | st.integers(1, 5000).map(
        lambda d: b'{"schema_version": 2, "x": ' + b"[" * d + b"]" * d + b"}"
    )
    | events.map(lambda e: json.dumps({**e, "kind": "header"}).encode() + b"\n")
)


@pytest.mark.slow
@FAST
@given(files)
def test_the_artifact_loader_refuses_any_bad_file_with_its_own_error(data: bytes) -> None:
    """Whatever the bytes of a file, ``artifact.load`` returns an artifact or raises
    ArtifactError (a ValueError with a message), never anything else."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "soak.json"
        path.write_bytes(data)
        try:
            loaded = artifact.load(path)
        except artifact.ArtifactError as exc:
            message = str(exc)
            assert message
            return
        assert isinstance(loaded, dict)


PARSER = build_parser()
#: Every option of ``run``, and values meant to break them.
RUN_OPTIONS = sorted(
    option
    for subparsers in PARSER._subparsers._group_actions  # type: ignore[union-attr]
    if isinstance(subparsers, argparse._SubParsersAction)
    for action in subparsers.choices["run"]._actions
    for option in action.option_strings
)
VALUES = st.sampled_from(
    ["inf", "nan", "-1", "0", "1e308", "1e-9", "0.05", "5", "abc", "", "1e30GiB", "2GiB",
     "SIGUSR1", "KILL", "0x10", "x=y", "=", "\x1b[2J", "9" * 5000, "-5s", "/dev/null"]
) | st.text(max_size=8)  # fmt: skip
run_argv = st.lists(st.sampled_from(RUN_OPTIONS) | VALUES, max_size=10).map(
    lambda tokens: ["run", "--progress-dir", "p", "--output", "o.json", *tokens]
)
other_argv = st.tuples(
    st.sampled_from(["summary", "report", "compare", "recover", "worker", "jobs", "nope"]),
    st.lists(VALUES | st.sampled_from(["--json", "-o", "--compare", "--poll"]), max_size=5),
).map(lambda parts: [parts[0], *parts[1]])


@FAST
@given(run_argv | other_argv)
def test_any_argv_parses_or_is_a_clean_usage_error(argv: list[str]) -> None:
    """Parsing any argv (and checking ``run``'s flags, which launches nothing) ends in exit
    status 0 or 2 from argparse, a UsageError, or flags checked, never a traceback."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            args = PARSER.parse_args(argv)
        except SystemExit as exc:
            code = exc.code
            assert code in (0, 2)
            return
        if args.subcommand == "run":
            with contextlib.suppress(UsageError):
                check_run_flags(args)


@pytest.mark.parametrize("value", ["1e308", "inf", "1e-9"])
def test_the_fuzzed_flags_include_the_bounds(value: str) -> None:
    """The values the fuzzing leans on are refused by the flags' check, not only parsed."""
    args = PARSER.parse_args(["run", "--progress-dir", "p", "--output", "o.json",
                              "--sample-interval", value, "--", "true"])  # fmt: skip
    with pytest.raises(UsageError, match="--sample-interval"):
        check_run_flags(args)

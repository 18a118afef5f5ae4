"""``run_soak``, the front door: light to import; the supervisor behind it (0.2 s of imports)
is imported in a thread at the first call, so a host's loop never stalls on it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import importlib
import inspect
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypedDict, Unpack, cast

if TYPE_CHECKING:
    from .._contract import Artifact
    from .._export import Metrics
    from .._sampling import LossCheck, ProgressSource
    from ._checks import StopMode
    from ._config import LeakCheck, SoakConfig
    from ._control import SoakControl

#: Bound on importing the supervisor at the first call (a cold cache, a slow filesystem).
IMPORT_TIMEOUT_SECONDS = 60.0

_P = ParamSpec("_P")
#: The supervisor's module, imported whole (a module half-imported by another thread is in
#: ``sys.modules`` already, so that cannot tell).
_SUPERVISOR = f"{__package__}._soak"
_imported: list[str] = []


async def _import_supervisor() -> None:
    """Import the supervisor in a thread of its own (at the first call), never on the loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        from .._contract import require_asyncio

        require_asyncio("run_soak")  # raises, naming the asyncio requirement
        raise
    if _imported:
        return
    imported: concurrent.futures.Future[None] = concurrent.futures.Future()
    imported.set_running_or_notify_cancel()  # a caller's timeout must not cancel the thread's

    def work() -> None:
        try:
            # anyio loads its asyncio backend at its first call: here too, not on the loop.
            importlib.import_module("anyio._backends._asyncio")
            importlib.import_module(_SUPERVISOR)
        except BaseException as exc:  # handed to the caller
            imported.set_exception(exc)
        else:
            imported.set_result(None)

    threading.Thread(target=work, name="asyncsoak-import", daemon=True).start()
    async with asyncio.timeout(IMPORT_TIMEOUT_SECONDS):
        await asyncio.wrap_future(imported, loop=loop)
    _imported.append(_SUPERVISOR)


class SoakSettings(TypedDict, total=False):
    """``run_soak``'s keywords beyond the reference's, typed: :class:`SoakConfig`'s other fields,
    which define their defaults and checks (tests/test_api.py holds the two equal)."""

    max_duration_seconds: float | None
    stop_mode: StopMode
    output_is_progress: bool
    log_path: Path | str | None
    snapshot_root: Path | str | None
    nvidia_smi: str | None
    kill_wait_seconds: float
    log_max_bytes: int
    dump_signal: int | str | None
    forensics: bool
    detailed_memory: bool
    forward_signals: Sequence[int | str]
    requeue_on: int | str | None
    warm_up_seconds: float | None
    leak_check: LeakCheck
    max_rss_bytes: int | str | None
    max_gpu_memory_bytes: int | str | None
    min_disk_free_bytes: int | str | None
    progress_exclude: Sequence[Path | str]
    progress_source: ProgressSource
    step_key: str | None
    loss_key: str | None
    loss_check: LossCheck
    expect_every: Mapping[str, float] | None
    stale_progress_carried_seconds: float | None
    scheduler_grace_seconds: float | None
    checkpoint_globs: Sequence[str]
    earlier_highest_step: int | None


#: The settings ``run_soak`` needs when no ``config`` is given.
_REQUIRED_SETTINGS = ("command", "progress_dir", "output_path")
#: ``run_soak``'s arguments that are not settings: they go with either form of the settings.
_NOT_SETTINGS = frozenset({"config", "control", "metrics"})


def _settings_as_config(
    soak: Callable[_P, Coroutine[Any, Any, Artifact]],
) -> Callable[_P, Coroutine[Any, Any, Artifact]]:
    """Settings as keywords or one :class:`SoakConfig`, never both: told by the keywords the
    caller wrote (before defaults fill in), made into the ``config`` the wrapped function gets."""
    signature = inspect.signature(soak)
    configured = cast("Callable[..., Coroutine[Any, Any, Artifact]]", soak)

    @functools.wraps(soak)
    async def call(*args: _P.args, **kwargs: _P.kwargs) -> Artifact:
        # A positional argument: Python's own TypeError; an unknown keyword: the same words.
        given = signature.bind(*args, **kwargs).arguments
        given.update(given.pop("settings", {}))
        known = signature.parameters.keys() | SoakSettings.__annotations__.keys()
        for name in given.keys() - known:
            raise TypeError(f"run_soak() got an unexpected keyword argument {name!r}")
        await _import_supervisor()
        from .._contract import ValidationTypeError
        from ._config import SoakConfig

        settings = {name: value for name, value in given.items() if name not in _NOT_SETTINGS}
        config = given.get("config")
        if config is None:
            missing = [name for name in _REQUIRED_SETTINGS if name not in settings]
            if missing:
                raise ValidationTypeError(
                    f"run_soak() needs {', '.join(missing)} (or config=SoakConfig(...))"
                )
            config = SoakConfig(**settings)
        elif settings:
            raise ValidationTypeError(
                "run_soak() takes its settings as keywords or as config, not both: "
                f"config was given with {', '.join(settings)}"
            )
        elif not isinstance(config, SoakConfig):
            raise ValidationTypeError(f"config must be a SoakConfig, not {type(config).__name__}")
        return await configured(
            config=config, control=given.get("control"), metrics=given.get("metrics")
        )

    return call


@_settings_as_config
async def run_soak(
    *,
    command: Sequence[str] | None = None,
    progress_dir: Path | str | None = None,
    output_path: Path | str | None = None,
    sample_interval_seconds: float = 5.0,
    startup_timeout_seconds: float = 600.0,
    stale_progress_seconds: float | Literal["auto"] = 120.0,
    post_shutdown_grace_seconds: float = 5.0,
    min_duration_seconds: float = 0.0,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    config: SoakConfig | None = None,
    control: SoakControl | None = None,
    metrics: Metrics | None = None,
    **settings: Unpack[SoakSettings],
) -> Artifact:
    """Run a command in its own process group and produce a soak artifact.

    Fails the soak when ``progress_dir`` stops showing progress (file growth, or training steps
    when the trainer writes them) or a rule fires.  Settings come as keywords (those of
    :class:`SoakSettings`, :class:`SoakConfig`'s defaults; docs/running.md says what each does)
    or as one checked ``config=``, not both.  Returns the artifact (also written to
    ``output_path``) when the soak passed or was stopped through ``control`` (``"cancelled"``).
    Raises :class:`SoakFailureError` when a rule fired, after writing it; on the caller's
    cancellation, the tree is stopped and a ``cancelled`` artifact written before it propagates.
    """
    assert config is not None
    from ._soak import run_configured

    return await run_configured(config, control, metrics)

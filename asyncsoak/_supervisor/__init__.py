"""The supervisor: ``run_soak`` and its task group, its checked configuration, the caller's
control, the stop, the verdict, the soak's own files, and the scheduler it may run under."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._contract import lazy_door

if TYPE_CHECKING:
    from . import _kubernetes as kubernetes  # noqa: F401 (a module the door hands out whole)
    from . import _slurm as slurm  # noqa: F401 (a module the door hands out whole)
    from ._checks import STOP_MODES as STOP_MODES
    from ._checks import StopMode as StopMode
    from ._checks import seconds as seconds
    from ._config import SOAK_LIMITS as SOAK_LIMITS
    from ._config import SoakConfig as SoakConfig
    from ._config import SoakLimits as SoakLimits
    from ._config import forwarded_signals as forwarded_signals
    from ._config import validate_job as validate_job
    from ._control import SoakControl as SoakControl
    from ._front import run_soak as run_soak
    from ._outputs import OutputLocationError as OutputLocationError

__getattr__, __dir__ = lazy_door(__name__, __file__)

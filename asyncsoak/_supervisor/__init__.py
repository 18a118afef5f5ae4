"""The supervisor.

``run_soak`` and its task group, its validated configuration, the caller's control handle, the
stop sequence, the verdict on the command's exit, the runtime snapshot task, the soak's own
files and the artifact's write, and the scheduler it may run under.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._contract import lazy_door

if TYPE_CHECKING:
    from . import _kubernetes, _slurm
    from ._config import SOAK_LIMITS as SOAK_LIMITS
    from ._config import STOP_MODES as STOP_MODES
    from ._config import SoakConfig as SoakConfig
    from ._config import SoakLimits as SoakLimits
    from ._config import StopMode as StopMode
    from ._config import forwarded_signals as forwarded_signals
    from ._config import seconds as seconds
    from ._config import validate_job as validate_job
    from ._control import SoakControl as SoakControl
    from ._outputs import OutputLocationError as OutputLocationError
    from ._soak import run_soak as run_soak

    kubernetes = _kubernetes
    slurm = _slurm
else:
    __getattr__, __dir__ = lazy_door(
        __name__,
        {
            "SOAK_LIMITS": "._config",
            "STOP_MODES": "._config",
            "SoakConfig": "._config",
            "SoakLimits": "._config",
            "StopMode": "._config",
            "forwarded_signals": "._config",
            "seconds": "._config",
            "validate_job": "._config",
            "SoakControl": "._control",
            "OutputLocationError": "._outputs",
            "run_soak": "._soak",
        },
        modules={"kubernetes": "._kubernetes", "slurm": "._slurm"},
    )

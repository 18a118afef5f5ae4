"""Finding ``nvidia-smi``: before the GPU sampler's modules are imported, so a machine without
it pays nothing for them (8 ms as the command starts); the note says why there is no GPU data."""

from __future__ import annotations

import shutil

import anyio

from .._contract import BlockingCallTimeout, EventSink, events, run_blocking

#: The sampler named in the GPU sampler's notes.
SAMPLER = "gpu"


async def find_nvidia_smi(
    sink: EventSink, nvidia_smi: str, *, call_timeout: float, limiter: anyio.CapacityLimiter
) -> str | None:
    """The path of ``nvidia_smi``; None, told in a note, where there is none."""
    try:
        executable = await run_blocking(
            shutil.which,
            nvidia_smi,
            timeout=call_timeout,
            what=f"looking up {nvidia_smi!r}",
            limiter=limiter,
        )
    except BlockingCallTimeout as exc:
        message = f"no GPU data: {exc}"
    else:
        if executable is not None:
            return executable
        message = f"no GPU data: {nvidia_smi!r} not found"
    data = {"nvidia_smi": nvidia_smi}
    await sink.emit(
        events.SamplerNote(t=sink.elapsed(), sampler=SAMPLER, message=message, data=data)
    )
    return None

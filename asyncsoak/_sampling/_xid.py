"""Xid errors: the kernel log's ``NVRM: Xid`` lines read, and what each code means (NVIDIA's
catalogue, docs.nvidia.com/deploy/xid-errors; a code not in :data:`XID_CODES` is a warning).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Xid:
    """One Xid code: what it means, what to do, and whether it fails the run by default."""

    code: int
    meaning: str
    action: str
    fails: bool


_DEBUG = "debug the application (compute-sanitizer); if it repeats across applications, run "
_RESET = "drain the node and reset the GPU"
_REBOOT = f"{_RESET} (or reboot)"

#: The Xid codes asyncsoak knows (NVIDIA's catalogue): what each means, and what to do.
_MEANINGS = {
    13: "graphics engine exception (an illegal memory access or instruction in a kernel)",
    31: "GPU memory page fault (a kernel touched an invalid address)",
    43: "GPU stopped processing (a channel was reset after an application fault)",
    45: "preemptive cleanup after earlier errors (a process was ended on the GPU)",
    48: "double-bit (uncorrectable) ECC error",
    61: "internal micro-controller breakpoint or warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapper recording failure",
    68: "video processor (NVDEC) exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error (the applications that touched the memory were stopped)",
    95: "uncontained ECC error (every application on the GPU is affected)",
    119: "GSP RPC timeout (the GPU's system processor did not answer)",
    120: "GSP error (the GPU's system processor failed)",
    140: "unrecovered ECC error",
    154: "GPU recovery action changed (a reset or reboot is required)",
}
_ACTIONS = {
    13: _DEBUG + "the GPU diagnostics (dcgmi diag)",
    31: _DEBUG + "the GPU diagnostics",
    43: "the application's error: read its log; the GPU stays usable",
    45: "look for the Xid logged before it: that one is the cause",
    48: f"{_RESET}; if it repeats, have the GPU replaced",
    61: "reset the GPU; report it to the administrator if it repeats",
    62: _REBOOT,
    63: "reset the GPU when convenient so the retirement or remap takes effect",
    64: "drain the node, reset the GPU and run the diagnostics; have the GPU replaced if it "
    "repeats",
    68: "debug the application's video decoding; reset the GPU if it repeats",
    69: "debug the application; run the GPU diagnostics if it repeats",
    74: "drain the node, check the NVLink connections and reset the GPUs on that link",
    79: "drain the node; check the GPU's power and PCIe seating, then reboot",
    92: "watch the GPU's ECC counters; reset it and run the diagnostics when convenient",
    94: "restart the run from its checkpoint; reset the GPU when it is free",
    95: f"{_RESET} before any further work",
    119: _REBOOT,
    120: _REBOOT,
    140: _RESET,
    154: "drain the node and do the recovery action the driver names (reset or reboot)",
}
#: The documented default of which fail the run (the hardware, the driver or its firmware
#: broke); the others warn (most often the application's own error, which its exit status
#: reports anyway).
_FAILING = frozenset({48, 61, 62, 64, 74, 79, 94, 95, 119, 120, 140, 154})
XID_CODES: dict[int, Xid] = {
    code: Xid(code, meaning, _ACTIONS[code], code in _FAILING)
    for code, meaning in _MEANINGS.items()
}


def xid_info(code: int) -> Xid:
    """The table's entry for ``code``; an unknown code is a warning, to be looked up."""
    return XID_CODES.get(code) or Xid(
        code,
        "an Xid asyncsoak does not know",
        "look it up in NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors)",
        False,
    )


#: A PCI address's (domain, bus, device): the function is left out, as the Xid line does.
PciKey = tuple[int, int, int]

_XID_LINE = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[^)]*)\): (?P<code>\d+)\b,?\s*(?P<detail>.*)")
_XID_MARK = "NVRM: Xid"


def pci_key(address: str) -> PciKey | None:
    """``00000000:3B:00.0`` (nvidia-smi), ``0000:3b:00`` (an Xid line) -> ``(0, 0x3b, 0)``."""
    parts = address.strip().split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2].split(".", 1)[0], 16)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class XidRecord:
    """One Xid line of the kernel log."""

    pci: PciKey
    code: int
    #: The rest of the line (``pid=..., name=..., GPU has fallen off the bus.``).
    detail: str
    kernel_seconds: float


class MalformedXidError(ValueError):
    """A kernel log record that says ``NVRM: Xid`` but is not the driver's Xid line."""


def parse_xid(message: str, kernel_seconds: float = 0.0) -> XidRecord | None:
    """The Xid a kernel log message reports; None for any other message.  Raises
    :class:`MalformedXidError` for one that names an Xid but cannot be read."""
    if _XID_MARK not in message:
        return None
    match = _XID_LINE.search(message)
    pci = None if match is None else pci_key(match["pci"])
    if match is None or pci is None:
        raise MalformedXidError(f"unreadable Xid record: {message.strip()[:200]!r}")
    return XidRecord(pci, int(match["code"]), match["detail"].strip()[:300], kernel_seconds)

"""What a GPU says about its own health, judged: Xid errors, ECC, row remaps, a GPU lost.

The GPU sampler feeds :class:`GpuHealthWatch` at every tick: the GPU readings (uncorrectable
ECC count, remapped rows, pages pending retirement, PCIe link), the lines ``nvidia-smi`` printed
instead of a row ("Unable to determine the device handle for GPU...: GPU is lost"), and the
kernel log's new records (``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the
bus.``).  It returns :class:`~asyncsoak._contract._events.GpuFault` events; the supervisor
fails the run (``gpu_fault``) for a fault that ``fails`` on a GPU the tree ``used``, and warns
for the rest.

Which GPUs the tree uses: those ``CUDA_VISIBLE_DEVICES`` names (indices as ``nvidia-smi``
numbers them, as with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, or ``GPU-`` UUIDs and their prefixes),
and every GPU on which a process of the tree held memory.  With ``CUDA_VISIBLE_DEVICES`` unset
and no process of the tree seen on a GPU yet, every GPU counts (the run can use them all; fail
closed) but one that other work holds: a GPU on which only processes outside the tree were seen,
each one found in this PID namespace with no tree process among its ancestors (another job on a
shared node).  A pid that cannot be found here (a container's ``nvidia-smi`` shows the host's
pids) proves nothing, and the GPU counts.  An entry that cannot be matched (a ``MIG-`` UUID)
also makes every GPU count.

Xid codes and what to do come from NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors);
:data:`XID_CODES` keeps the common ones, with which fail the run by default.  An Xid not in the
table is a warning.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .._contract import GpuFault, GpuFaultKind
from ._nvidia_smi import GpuReading

#: Utilisation (percent) at or above which a GPU is "under load" for the PCIe link check: an
#: idle GPU trains its link down on purpose to save power.
LINK_LOAD_PERCENT = 50.0
#: What to do about a GPU that is lost.
LOST_ACTION = "drain the node; check the GPU's power and PCIe seating, then reboot"


@dataclass(frozen=True, slots=True)
class Xid:
    """One Xid code: what it means, what to do, and whether it fails the run by default."""

    code: int
    meaning: str
    action: str
    fails: bool


def _xid(code: int, meaning: str, action: str, *, fails: bool) -> tuple[int, Xid]:
    return code, Xid(code, meaning, action, fails)


#: The Xid codes asyncsoak knows (NVIDIA's catalogue).  ``fails``: the documented default of
#: which fail the run (the hardware, the driver or its firmware broke) and which warn (most
#: often the application's own error, which its exit status reports anyway).
XID_CODES: dict[int, Xid] = dict(
    [
        _xid(
            13,
            "graphics engine exception (an illegal memory access or instruction in a kernel)",
            "debug the application (compute-sanitizer); if it repeats across applications, "
            "run the GPU diagnostics (dcgmi diag)",
            fails=False,
        ),
        _xid(
            31,
            "GPU memory page fault (a kernel touched an invalid address)",
            "debug the application (compute-sanitizer); if it repeats across applications, "
            "run the GPU diagnostics",
            fails=False,
        ),
        _xid(
            43,
            "GPU stopped processing (a channel was reset after an application fault)",
            "the application's error: read its log; the GPU stays usable",
            fails=False,
        ),
        _xid(
            45,
            "preemptive cleanup after earlier errors (a process was ended on the GPU)",
            "look for the Xid logged before it: that one is the cause",
            fails=False,
        ),
        _xid(
            48,
            "double-bit (uncorrectable) ECC error",
            "drain the node and reset the GPU; if it repeats, have the GPU replaced",
            fails=True,
        ),
        _xid(
            61,
            "internal micro-controller breakpoint or warning",
            "reset the GPU; report it to the administrator if it repeats",
            fails=True,
        ),
        _xid(
            62,
            "internal micro-controller halt",
            "drain the node and reset the GPU (or reboot)",
            fails=True,
        ),
        _xid(
            63,
            "ECC page retirement or row remapping recorded",
            "reset the GPU when convenient so the retirement or remap takes effect",
            fails=False,
        ),
        _xid(
            64,
            "ECC page retirement or row remapper recording failure",
            "drain the node, reset the GPU and run the diagnostics; have the GPU replaced if "
            "it repeats",
            fails=True,
        ),
        _xid(
            68,
            "video processor (NVDEC) exception",
            "debug the application's video decoding; reset the GPU if it repeats",
            fails=False,
        ),
        _xid(
            69,
            "graphics engine class error",
            "debug the application; run the GPU diagnostics if it repeats",
            fails=False,
        ),
        _xid(
            74,
            "NVLink error",
            "drain the node, check the NVLink connections and reset the GPUs on that link",
            fails=True,
        ),
        _xid(
            79,
            "GPU has fallen off the bus",
            "drain the node; check the GPU's power and PCIe seating, then reboot",
            fails=True,
        ),
        _xid(
            92,
            "high single-bit ECC error rate",
            "watch the GPU's ECC counters; reset it and run the diagnostics when convenient",
            fails=False,
        ),
        _xid(
            94,
            "contained ECC error (the applications that touched the memory were stopped)",
            "restart the run from its checkpoint; reset the GPU when it is free",
            fails=True,
        ),
        _xid(
            95,
            "uncontained ECC error (every application on the GPU is affected)",
            "drain the node and reset the GPU before any further work",
            fails=True,
        ),
        _xid(
            119,
            "GSP RPC timeout (the GPU's system processor did not answer)",
            "drain the node and reset the GPU (or reboot)",
            fails=True,
        ),
        _xid(
            120,
            "GSP error (the GPU's system processor failed)",
            "drain the node and reset the GPU (or reboot)",
            fails=True,
        ),
        _xid(
            140,
            "unrecovered ECC error",
            "drain the node and reset the GPU",
            fails=True,
        ),
        _xid(
            154,
            "GPU recovery action changed (a reset or reboot is required)",
            "drain the node and do the recovery action the driver names (reset or reboot)",
            fails=True,
        ),
    ]
)


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
_DEVICE_HANDLE = re.compile(
    r"Unable to determine the device handle for (?:GPU|gpu)\s*(?P<pci>[0-9A-Fa-f:.]+):\s*"
    r"(?P<why>.*)"
)
_GPU_IS_LOST = "GPU is lost"


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
    """The Xid a kernel log message reports; None for any other message.

    Raises :class:`MalformedXidError` for a message that names an Xid but cannot be read.
    """
    if _XID_MARK not in message:
        return None
    match = _XID_LINE.search(message)
    pci = None if match is None else pci_key(match["pci"])
    if match is None or pci is None:
        raise MalformedXidError(f"unreadable Xid record: {message.strip()[:200]!r}")
    return XidRecord(pci, int(match["code"]), match["detail"].strip()[:300], kernel_seconds)


#: How far up its parents :func:`outside_tree` follows a process before giving up.
MAX_ANCESTRY = 64


def outside_tree(pid: int, tree: Collection[int], proc: Path = Path("/proc")) -> bool:
    """Whether ``pid`` is proven other work's: found in this PID namespace, with no process of
    ``tree`` among it and its ancestors (a process the tree started since the tree's pids were
    read is still the tree's).  A pid not found here (a container's ``nvidia-smi`` reports the
    host's pids) or an ancestry that cannot be followed proves nothing: False.

    ``/proc/PID/stat`` takes none of the locks that can make ``cmdline`` hang, and this runs
    only while the tree is on no GPU, once per pid proven another's.
    """
    for _ in range(MAX_ANCESTRY):
        if pid in tree:
            return False
        if pid <= 1:
            return True
        try:
            stat = (proc / str(pid) / "stat").read_bytes()
            pid = int(stat.rpartition(b")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def lost_gpu_line(line: str) -> tuple[str, str] | None:
    """``(PCI address, why)`` when an ``nvidia-smi`` line says a GPU cannot be reached."""
    match = _DEVICE_HANDLE.search(line)
    if match is not None:
        return match["pci"], " ".join(match["why"].split()) or "unknown error"
    return None


@dataclass(frozen=True, slots=True)
class VisibleDevices:
    """``CUDA_VISIBLE_DEVICES`` read: the indices and UUID prefixes it names.

    ``everything``: unset, or an entry that cannot be matched to a GPU (every GPU counts).
    """

    indices: frozenset[int]
    uuids: tuple[str, ...]
    everything: bool
    unset: bool

    @classmethod
    def parse(cls, value: str | None) -> VisibleDevices:
        if value is None:
            return cls(frozenset(), (), everything=True, unset=True)
        indices: set[int] = set()
        uuids: list[str] = []
        everything = False
        for raw in value.split(","):
            item = raw.strip()
            if not item:
                continue
            if item.lstrip("-").isdigit():
                number = int(item)
                if number < 0:
                    break  # CUDA stops at the first invalid index
                indices.add(number)
            elif item.startswith("GPU-"):
                uuids.append(item)
            else:
                # A MIG instance or a name CUDA may resolve another way: cannot be matched.
                everything = True
        return cls(frozenset(indices), tuple(uuids), everything=everything, unset=False)

    def names(self, index: int, uuid: str | None) -> bool:
        return (
            self.everything
            or index in self.indices
            or (uuid is not None and any(uuid.startswith(u) for u in self.uuids))
        )


@dataclass(slots=True)
class _Gpu:
    index: int
    uuid: str | None
    bus_id: str | None
    ecc_uncorrected: int | None = None
    remapped_pending: bool | None = None
    remapped_failure: bool | None = None
    retired_pending: bool | None = None
    link_noted: bool = False
    lost: bool = False


class GpuHealthWatch:
    """The health of every GPU of one soak, judged reading after reading.

    Each method returns the new faults, as events stamped ``t``.
    """

    def __init__(self, visible: VisibleDevices) -> None:
        self._visible = visible
        self._gpus: dict[int, _Gpu] = {}
        #: GPUs on which a process of the tree held memory.
        self._tree_gpus: set[int] = set()
        #: GPUs held by other work only (see the module's docstring): not the run's while
        #: ``CUDA_VISIBLE_DEVICES`` is unset and the tree is on none.  Kept once seen: the
        #: fault that ends the other job also takes its process off the list.
        self._other_gpus: set[int] = set()
        #: The indices listed by the first complete reading: a GPU missing later is lost.
        self._listed: frozenset[int] | None = None
        self._lost_unlisted: set[PciKey] = set()

    # -- who uses what -----------------------------------------------------------------

    def tree_on(self, indices: Iterable[int]) -> None:
        self._tree_gpus.update(indices)

    @property
    def counts_other_work(self) -> bool:
        """Whether other work's GPUs matter now: ``CUDA_VISIBLE_DEVICES`` unset, the tree on
        no GPU yet."""
        return self._visible.unset and not self._tree_gpus

    def others_on(self, indices: Iterable[int]) -> None:
        """GPUs on which every process listed is other work's (outside the tree, proven)."""
        self._other_gpus.update(indices)

    def used(self, index: int | None, uuid: str | None) -> bool:
        """Whether the tree uses this GPU (see the module's docstring)."""
        if index is None:
            return True
        if index in self._tree_gpus:
            return True
        if self._visible.unset:
            return not self._tree_gpus and index not in self._other_gpus
        return self._visible.names(index, uuid)

    def gpu_of(self, pci: PciKey) -> _Gpu | None:
        for gpu in self._gpus.values():
            if gpu.bus_id is not None and pci_key(gpu.bus_id) == pci:
                return gpu
        return None

    @property
    def known(self) -> bool:
        return bool(self._gpus)

    # -- readings ----------------------------------------------------------------------

    def readings(
        self, t: float, readings: Sequence[GpuReading], *, whole: bool = True
    ) -> list[GpuFault]:
        """Faults in one iteration's readings: counts that rose, flags set, GPUs missing.

        ``whole``: every row of the iteration was read.  A row that could not be parsed is no
        GPU missing from the list: then none is judged missing."""
        faults: list[GpuFault] = []
        for reading in readings:
            gpu = self._gpus.get(reading.index)
            if gpu is None:
                gpu = self._gpus[reading.index] = _Gpu(reading.index, reading.uuid, reading.bus_id)
                faults.extend(self._baseline(t, gpu, reading))
            else:
                faults.extend(self._changes(t, gpu, reading))
            faults.extend(self._link(t, gpu, reading))
        seen = frozenset(r.index for r in readings)
        if not whole:
            return faults
        if self._listed is None:
            self._listed = seen
        else:
            for index in sorted(self._listed - seen):
                gpu = self._gpus[index]
                if not gpu.lost:
                    faults.append(self.lost(t, gpu, "nvidia-smi no longer lists it"))
        return faults

    def all_lost(self, t: float, why: str) -> list[GpuFault]:
        """Every GPU listed at the start is gone ("No devices were found")."""
        return [self.lost(t, gpu, why) for gpu in self._gpus.values() if not gpu.lost]

    def lost_line(self, t: float, address: str, why: str) -> list[GpuFault]:
        """``nvidia-smi`` printed "Unable to determine the device handle" for ``address``."""
        pci = pci_key(address)
        gpu = None if pci is None else self.gpu_of(pci)
        if gpu is None:
            if pci is None or self._gpus or pci in self._lost_unlisted:
                return []  # an address that is no GPU of this soak, or said already
            # Lost before nvidia-smi ever listed it: the run cannot be using it (CUDA does not
            # list it either), so it is a warning, whichever GPU it was.
            self._lost_unlisted.add(pci)
            gpu = _Gpu(-1, None, address)
            gpu.lost = True
            return [
                self._fault(
                    t,
                    gpu,
                    GpuFaultKind.LOST,
                    f"GPU is lost already at the start (nvidia-smi: Unable to determine the "
                    f"device handle: {why})",
                    fails=False,
                    action=LOST_ACTION,
                )
            ]
        if gpu.lost:
            return []
        return [self.lost(t, gpu, f"nvidia-smi: Unable to determine the device handle: {why}")]

    def lost(self, t: float, gpu: _Gpu, why: str) -> GpuFault:
        gpu.lost = True
        return self._fault(
            t,
            gpu,
            GpuFaultKind.LOST,
            f"GPU is lost ({why})",
            fails=True,
            action=LOST_ACTION,
        )

    def _baseline(self, t: float, gpu: _Gpu, reading: GpuReading) -> list[GpuFault]:
        """The first reading: counts are the baseline; a flag already set is a warning."""
        gpu.ecc_uncorrected = reading.ecc_uncorrected_volatile
        gpu.remapped_pending = reading.remapped_rows_pending
        gpu.remapped_failure = reading.remapped_rows_failure
        gpu.retired_pending = reading.retired_pages_pending
        faults = []
        for kind, flag, what in self._flags(reading):
            if flag:
                faults.append(
                    self._fault(
                        t,
                        gpu,
                        kind,
                        f"{what} already at the start of the run",
                        fails=False,
                        action="reset the GPU before the next run",
                    )
                )
        return faults

    def _changes(self, t: float, gpu: _Gpu, reading: GpuReading) -> list[GpuFault]:
        faults = []
        ecc = reading.ecc_uncorrected_volatile
        if ecc is not None:
            before = gpu.ecc_uncorrected
            if before is not None and ecc > before:
                faults.append(
                    self._fault(
                        t,
                        gpu,
                        GpuFaultKind.ECC_UNCORRECTED,
                        f"uncorrectable ECC errors rose from {before} to {ecc} "
                        "(ecc.errors.uncorrected.volatile.total)",
                        fails=True,
                        action="drain the node and reset the GPU; have it replaced if it repeats",
                    )
                )
            gpu.ecc_uncorrected = ecc if before is None else max(before, ecc)
        previous = {
            GpuFaultKind.REMAPPED_ROWS_PENDING: gpu.remapped_pending,
            GpuFaultKind.REMAPPED_ROWS_FAILURE: gpu.remapped_failure,
            GpuFaultKind.RETIRED_PAGES_PENDING: gpu.retired_pending,
        }
        for kind, flag, what in self._flags(reading):
            if flag and not previous[kind]:
                faults.append(
                    self._fault(
                        t,
                        gpu,
                        kind,
                        f"{what} during the run",
                        fails=True,
                        action="drain the node and reset the GPU so the memory repair takes "
                        "effect; have it replaced if rows cannot be remapped",
                    )
                )
        gpu.remapped_pending = reading.remapped_rows_pending or gpu.remapped_pending
        gpu.remapped_failure = reading.remapped_rows_failure or gpu.remapped_failure
        gpu.retired_pending = reading.retired_pages_pending or gpu.retired_pending
        return faults

    @staticmethod
    def _flags(reading: GpuReading) -> list[tuple[GpuFaultKind, bool | None, str]]:
        return [
            (
                GpuFaultKind.REMAPPED_ROWS_PENDING,
                reading.remapped_rows_pending,
                "row remapping pending (remapped_rows.pending)",
            ),
            (
                GpuFaultKind.REMAPPED_ROWS_FAILURE,
                reading.remapped_rows_failure,
                "row remapping failed (remapped_rows.failure)",
            ),
            (
                GpuFaultKind.RETIRED_PAGES_PENDING,
                reading.retired_pages_pending,
                "memory pages pending retirement (retired_pages.pending)",
            ),
        ]

    def _link(self, t: float, gpu: _Gpu, reading: GpuReading) -> list[GpuFault]:
        """A PCIe link below its maximum while the GPU works: a warning, once per GPU."""
        busy = (reading.utilization_gpu_percent or 0.0) >= LINK_LOAD_PERCENT
        if gpu.link_noted or not busy:
            return []
        below = []
        for what, current, top in (
            ("generation", reading.pcie_link_gen_current, reading.pcie_link_gen_max),
            ("width", reading.pcie_link_width_current, reading.pcie_link_width_max),
        ):
            if current is not None and top is not None and current < top:
                shown = f"x{current} of x{top}" if what == "width" else f"{current} of {top}"
                below.append(f"{what} {shown}")
        if not below:
            return []
        gpu.link_noted = True
        return [
            self._fault(
                t,
                gpu,
                GpuFaultKind.PCIE_LINK,
                f"PCIe link below its maximum under load: {', '.join(below)}",
                fails=False,
                action="reseat the GPU or check its riser and slot; transfers to it are slower",
            )
        ]

    # -- the kernel log ----------------------------------------------------------------

    def xid(self, t: float, record: XidRecord) -> GpuFault | None:
        """The fault of an Xid on a GPU of this soak; None for another machine's address."""
        gpu = self.gpu_of(record.pci)
        if gpu is None:
            return None
        info = xid_info(record.code)
        detail = f" ({record.detail})" if record.detail else ""
        return self._fault(
            t,
            gpu,
            GpuFaultKind.XID,
            f"Xid {record.code}: {info.meaning}{detail}",
            fails=info.fails,
            action=info.action,
            xid=record.code,
            meaning=info.meaning,
            kernel_seconds=record.kernel_seconds,
        )

    # -- events ------------------------------------------------------------------------

    def _fault(
        self,
        t: float,
        gpu: _Gpu,
        kind: GpuFaultKind,
        what: str,
        *,
        fails: bool,
        action: str,
        xid: int | None = None,
        meaning: str | None = None,
        kernel_seconds: float | None = None,
    ) -> GpuFault:
        index = None if gpu.index < 0 else gpu.index
        name = f"gpu{index}" if index is not None else "a GPU"
        where = ", ".join(p for p in (gpu.bus_id, gpu.uuid) if p)
        return GpuFault(
            t=t,
            fault=kind,
            gpu=index,
            uuid=gpu.uuid,
            bus_id=gpu.bus_id,
            message=f"{name} ({where}) {what}. Action: {action}",
            fails=fails,
            used=self.used(index, gpu.uuid),
            xid=xid,
            meaning=meaning,
            action=action,
            kernel_seconds=kernel_seconds,
        )


def fault_gpu(fault: GpuFault | Mapping[str, object]) -> dict[str, object]:
    """The GPU a fault names, as the failure records it: ``{"index", "uuid", "bus_id"}``."""
    if isinstance(fault, GpuFault):
        return {"index": fault.gpu, "uuid": fault.uuid, "bus_id": fault.bus_id}
    return {"index": fault.get("gpu"), "uuid": fault.get("uuid"), "bus_id": fault.get("bus_id")}

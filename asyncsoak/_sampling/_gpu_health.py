"""What a GPU says about its own health, judged: Xid errors, ECC, row remaps, a GPU lost or
needing a reset, a slow PCIe link (docs/architecture.md, "The GPU sampler and GPU health")."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .._contract import GpuFaultKind, events
from ._nvidia_smi import RESET_FIELDS, RESET_VALUES, GpuReading
from ._xid import PciKey, XidRecord, pci_key, xid_info

#: Utilisation (percent) at or above which a GPU is "under load" for the PCIe link check: an
#: idle GPU trains its link down on purpose to save power.
LINK_LOAD_PERCENT = 50.0
#: What to do about a GPU that is lost.
LOST_ACTION = "drain the node; check the GPU's power and PCIe seating, then reboot"
#: Samples in a row of a GPU reading nothing but :data:`RESET_VALUES` that make it a fault.
RESET_SAMPLES = 2
RESET_ACTION = (
    "drain the node and reset the GPU (nvidia-smi -r) or reboot; the kernel log's Xid before "
    "it says why"
)
_FLAG_ACTION = (
    "drain the node and reset the GPU so the memory repair takes effect; have it replaced if "
    "rows cannot be remapped"
)
#: The flags a GPU raises about its memory: the fault (named as the reading's attribute, and
#: as the query field with its last "_" a "."), what it says.
_FLAGS = tuple(
    (kind, kind.value, "{} ({}.{})".format(what, *kind.value.rsplit("_", 1)))
    for kind, what in (
        (GpuFaultKind.REMAPPED_ROWS_PENDING, "row remapping pending"),
        (GpuFaultKind.REMAPPED_ROWS_FAILURE, "row remapping failed"),
        (GpuFaultKind.RETIRED_PAGES_PENDING, "memory pages pending retirement"),
    )
)

_DEVICE_HANDLE = re.compile(
    r"Unable to determine the device handle for (?:GPU|gpu)\s*(?P<pci>[0-9A-Fa-f:.]+):\s*"
    r"(?P<why>.*)"
)


def lost_gpu_line(line: str) -> tuple[str, str] | None:
    """``(PCI address, why)`` when an ``nvidia-smi`` line says a GPU cannot be reached."""
    match = _DEVICE_HANDLE.search(line)
    if match is not None:
        return match["pci"], " ".join(match["why"].split()) or "unknown error"
    return None


@dataclass(frozen=True, slots=True)
class VisibleDevices:
    """``CUDA_VISIBLE_DEVICES`` read: the indices and UUID prefixes it names.  ``everything``:
    unset, or an entry that cannot be matched to a GPU (every GPU counts)."""

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
            if item.lstrip("-").isdigit():
                if int(item) < 0:
                    break  # CUDA stops at the first invalid index
                indices.add(int(item))
            elif item.startswith("GPU-"):
                uuids.append(item)
            elif item:
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
    #: Each of :data:`_FLAGS` by its attribute, once raised (or as first read).
    flags: dict[str, bool | None] = field(default_factory=dict)
    link_noted: bool = False
    lost: bool = False
    seen: bool = False  # its first reading (the baseline) was judged
    unreadable: int = 0  # samples in a row reading nothing but RESET_VALUES


class GpuHealthWatch:
    """The health of every GPU of one soak, judged reading after reading: each method returns
    the new faults, as events stamped ``t``."""

    def __init__(self, visible: VisibleDevices) -> None:
        self._visible = visible
        self._gpus: dict[int, _Gpu] = {}  # by label (the index of its first reading)
        self._by_id: dict[str, _Gpu] = {}  # by UUID and by bus id
        self._tree_gpus: set[int] = set()  # where a process of the tree held memory
        #: GPUs held by other work only, kept once seen (the fault that ends the other job
        #: also takes its process off the list).
        self._other_gpus: set[int] = set()
        #: The labels listed by the first complete reading: a GPU missing later is lost.
        self._listed: frozenset[int] | None = None
        self._lost_unlisted: set[PciKey] = set()

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
        """Whether the tree uses this GPU."""
        if index is None or index in self._tree_gpus:
            return True
        if self._visible.unset:
            return not self._tree_gpus and index not in self._other_gpus
        return self._visible.names(index, uuid)

    def gpu_of(self, pci: PciKey) -> _Gpu | None:
        return next(
            (g for g in self._gpus.values() if g.bus_id is not None and pci_key(g.bus_id) == pci),
            None,
        )

    @property
    def known(self) -> bool:
        return bool(self._gpus)

    def identify(self, readings: Sequence[GpuReading]) -> list[GpuReading]:
        """``readings`` under their GPUs' labels: a GPU is found by UUID, else by bus id; one
        never seen keeps its index as its label (else the next free one)."""
        out = []
        for reading in readings:
            gpu = self._by_id.get(reading.uuid or "")
            if gpu is not None and gpu.index == reading.index:
                out.append(reading)  # the usual case, at every sample: nothing to do
                continue
            gpu = self._find(reading.uuid, reading.bus_id, reading.index)
            if gpu is None:
                label = reading.index
                if label < 0 or label in self._gpus:
                    label = max(self._gpus, default=-1) + 1
                gpu = self._gpus[label] = _Gpu(label, reading.uuid, reading.bus_id)
            for key in (reading.uuid, reading.bus_id):
                if key and key not in self._by_id:
                    self._by_id[key] = gpu
            gpu.uuid = gpu.uuid or reading.uuid
            gpu.bus_id = gpu.bus_id or reading.bus_id
            out.append(reading if reading.index == gpu.index else replace(reading, index=gpu.index))
        return out

    def gpu_index(self, uuid: str | None, bus_id: str | None) -> int | None:
        """The label of the GPU a compute app's ``gpu_uuid`` (else ``gpu_bus_id``) names."""
        gpu = self._find(uuid, bus_id)
        return None if gpu is None else gpu.index

    def _find(self, uuid: str | None, bus_id: str | None, index: int = -1) -> _Gpu | None:
        for key in (uuid, bus_id):
            if key and key in self._by_id:
                return self._by_id[key]
        return None if uuid or bus_id else self._gpus.get(index)

    def readings(
        self, t: float, readings: Sequence[GpuReading], *, whole: bool = True
    ) -> list[events.GpuFault]:
        """Faults in one iteration's readings: counts that rose, flags set, GPUs missing or
        needing a reset.  ``whole``: every row was read (else none is judged missing)."""
        faults: list[events.GpuFault] = []
        readings = self.identify(readings)
        for reading in readings:
            gpu = self._gpus[reading.index]
            faults += (
                self._changes(t, gpu, reading) if gpu.seen else self._baseline(t, gpu, reading)
            )
            gpu.seen = True
            faults += self._reset(t, gpu, reading) + self._link(t, gpu, reading)
        seen = frozenset(r.index for r in readings)
        if not whole:
            return faults
        if self._listed is None:
            self._listed = seen
        for index in sorted(self._listed - seen):
            if not self._gpus[index].lost:
                faults.append(self.lost(t, self._gpus[index], "nvidia-smi no longer lists it"))
        return faults

    def all_lost(self, t: float, why: str) -> list[events.GpuFault]:
        """Every GPU listed at the start is gone ("No devices were found")."""
        return [self.lost(t, gpu, why) for gpu in self._gpus.values() if not gpu.lost]

    def lost_line(self, t: float, address: str, why: str) -> list[events.GpuFault]:
        """``nvidia-smi`` printed "Unable to determine the device handle" for ``address``."""
        pci = pci_key(address)
        gpu = None if pci is None else self.gpu_of(pci)
        said = f"nvidia-smi: Unable to determine the device handle: {why}"
        if gpu is None:
            if pci is None or self._gpus or pci in self._lost_unlisted:
                return []  # an address that is no GPU of this soak, or said already
            # Lost before nvidia-smi ever listed it: the run cannot be using it (a warning).
            self._lost_unlisted.add(pci)
            gpu = _Gpu(-1, None, address, lost=True)
            what = f"GPU is lost already at the start ({said})"
            return [self._fault(t, gpu, GpuFaultKind.LOST, what, False, LOST_ACTION)]
        return [] if gpu.lost else [self.lost(t, gpu, said)]

    def lost(self, t: float, gpu: _Gpu, why: str) -> events.GpuFault:
        gpu.lost = True
        return self._fault(t, gpu, GpuFaultKind.LOST, f"GPU is lost ({why})", True, LOST_ACTION)

    def _baseline(self, t: float, gpu: _Gpu, reading: GpuReading) -> list[events.GpuFault]:
        """The first reading: counts are the baseline; a flag already set is a warning."""
        gpu.ecc_uncorrected = reading.ecc_uncorrected_volatile
        faults = []
        for kind, attr, what in _FLAGS:
            gpu.flags[attr] = getattr(reading, attr)
            if gpu.flags[attr]:
                what = f"{what} already at the start of the run"
                faults.append(
                    self._fault(t, gpu, kind, what, False, "reset the GPU before the next run")
                )
        return faults

    def _changes(self, t: float, gpu: _Gpu, reading: GpuReading) -> list[events.GpuFault]:
        faults = []
        ecc, before = reading.ecc_uncorrected_volatile, gpu.ecc_uncorrected
        if ecc is not None:
            if before is not None and ecc > before:
                what = (
                    f"uncorrectable ECC errors rose from {before} to {ecc} "
                    "(ecc.errors.uncorrected.volatile.total)"
                )
                action = "drain the node and reset the GPU; have it replaced if it repeats"
                faults.append(self._fault(t, gpu, GpuFaultKind.ECC_UNCORRECTED, what, True, action))
            gpu.ecc_uncorrected = ecc if before is None else max(before, ecc)
        for kind, attr, what in _FLAGS:
            flag = getattr(reading, attr)
            if flag and not gpu.flags[attr]:
                faults.append(
                    self._fault(t, gpu, kind, f"{what} during the run", True, _FLAG_ACTION)
                )
            gpu.flags[attr] = flag or gpu.flags[attr]
        return faults

    def _reset(self, t: float, gpu: _Gpu, reading: GpuReading) -> list[events.GpuFault]:
        """:data:`RESET_SAMPLES` readings in a row of nothing but :data:`RESET_VALUES`: once
        per episode."""
        values = [reading.errors.get(name) for name in RESET_FIELDS]
        if not all(value in RESET_VALUES for value in values):
            gpu.unreadable = 0
            return []
        gpu.unreadable += 1
        if gpu.unreadable != RESET_SAMPLES:
            return []
        read = " or ".join(sorted({str(v) for v in values}))
        what = (
            f"reads {read} for {', '.join(RESET_FIELDS)} in {RESET_SAMPLES} samples in a "
            "row: it needs a reset"
        )
        return [self._fault(t, gpu, GpuFaultKind.RESET_REQUIRED, what, True, RESET_ACTION)]

    def _link(self, t: float, gpu: _Gpu, reading: GpuReading) -> list[events.GpuFault]:
        """A PCIe link below its maximum while the GPU works: a warning, once per GPU."""
        busy = (reading.utilization_gpu_percent or 0.0) >= LINK_LOAD_PERCENT
        if gpu.link_noted or not busy:
            return []
        below = []
        for what, unit, current, top in (
            ("generation", "", reading.pcie_link_gen_current, reading.pcie_link_gen_max),
            ("width", "x", reading.pcie_link_width_current, reading.pcie_link_width_max),
        ):
            if current is not None and top is not None and current < top:
                below.append(f"{what} {unit}{current} of {unit}{top}")
        if not below:
            return []
        gpu.link_noted = True
        what = f"PCIe link below its maximum under load: {', '.join(below)}"
        action = "reseat the GPU or check its riser and slot; transfers to it are slower"
        return [self._fault(t, gpu, GpuFaultKind.PCIE_LINK, what, False, action)]

    def xid(self, t: float, record: XidRecord) -> events.GpuFault | None:
        """The fault of an Xid on a GPU of this soak; None for another machine's address."""
        gpu = self.gpu_of(record.pci)
        if gpu is None:
            return None
        info = xid_info(record.code)
        what = f"Xid {record.code}: {info.meaning}" + (
            f" ({record.detail})" if record.detail else ""
        )
        extra = {
            "xid": record.code,
            "meaning": info.meaning,
            "kernel_seconds": record.kernel_seconds,
        }
        return self._fault(t, gpu, GpuFaultKind.XID, what, info.fails, info.action, **extra)

    def _fault(
        self,
        t: float,
        gpu: _Gpu,
        kind: GpuFaultKind,
        what: str,
        fails: bool,
        action: str,
        **xid: Any,
    ) -> events.GpuFault:
        index = None if gpu.index < 0 else gpu.index
        name = f"gpu{index}" if index is not None else "a GPU"
        where = ", ".join(p for p in (gpu.bus_id, gpu.uuid) if p)
        return events.GpuFault(
            t=t,
            fault=kind,
            gpu=index,
            uuid=gpu.uuid,
            bus_id=gpu.bus_id,
            message=f"{name} ({where}) {what}. Action: {action}",
            fails=fails,
            used=self.used(index, gpu.uuid),
            action=action,
            **xid,
        )


def fault_gpu(fault: events.GpuFault | Mapping[str, object]) -> dict[str, object]:
    """The GPU a fault names, as the failure records it: ``{"index", "uuid", "bus_id"}``."""
    if isinstance(fault, events.GpuFault):
        return {"index": fault.gpu, "uuid": fault.uuid, "bus_id": fault.bus_id}
    return {"index": fault.get("gpu"), "uuid": fault.get("uuid"), "bus_id": fault.get("bus_id")}

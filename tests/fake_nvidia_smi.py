"""A stand-in for ``nvidia-smi`` that replays output captured on an NVIDIA H200.

Standalone (standard library only); the tests install it as ``nvidia-smi`` through
``tests/gpu_support.py``.  The values come from the unedited captures in
``tests/fixtures/nvidia-smi/h200`` (described by ``tests/fixtures/nvidia-smi/README.md``):
each requested field is looked up by its column in the fixture's field list, so the fake
answers the fields asked in the order asked, as nvidia-smi does, and rejects unknown ones
with nvidia-smi's own message and exit status.

Settings (environment):

- ``FAKE_SMI_MODE``: ``idle`` (no process on the GPU), ``load`` (one process), ``two`` (the
  capture of two processes coming and going), ``hang`` (stops answering), ``garbage`` (lines
  that are not rows), ``no-devices`` (exit 6, "No devices were found").
- ``FAKE_SMI_PID_FILE``: a file holding the pid to put in place of 886, read at every
  iteration; while it does not exist the GPU has no process (for a soak whose child writes its
  own pid there once it runs).
- ``FAKE_SMI_PID`` / ``FAKE_SMI_PID2``: pids put in place of the captured ones (886, or 417
  and 447 in ``two`` mode).
- ``FAKE_SMI_GPUS``: how many GPUs to report (the captured row, renumbered).
- ``FAKE_SMI_TRUNCATE_ROW``: set, every second loop iteration prints the rows after the
  first GPU's without their last field (rows that cannot be parsed).
- ``FAKE_SMI_ROW_STAMPS``: set, each GPU row of a loop iteration has its own timestamp, a
  millisecond after the row before it (rows read one by one on a slow bus).
- ``FAKE_SMI_WHOLE_SECONDS``: set, every timestamp is printed in whole seconds (as some
  nvidia-smi builds do): a loop faster than 1 s prints several iterations with one stamp.
- ``FAKE_SMI_HANG_AFTER``: in ``hang`` mode, lines each process prints before hanging.
- ``FAKE_SMI_LOOP_ITERATIONS``: a ``-lms`` loop prints this many iterations, then exits.
- ``FAKE_SMI_REJECT``: comma-separated fields to reject as an older driver would.
- ``FAKE_SMI_LOG``: a file to which every invocation appends ``{"pid", "argv"}``.
- ``FAKE_SMI_GROW_MIB_PER_S``: the processes' GPU memory (and the GPU's used memory) grows
  this many MiB per second since ``FAKE_SMI_GROW_SINCE`` (a ``time.time()``; default: when
  this invocation started), as a leaking trainer's would.
- ``FAKE_SMI_BUS_ID``: the PCI address of GPU 0 (``00000000:3B:00.0``); GPU ``i`` gets the bus
  number plus ``i``.  Tests that write Xid lines into the kernel log give each soak an address
  of its own: every reader of ``/dev/kmsg`` on the machine sees every line.
- ``FAKE_SMI_UTIL`` / ``FAKE_SMI_POWER_W``: the GPUs' utilisation (percent) and power draw
  (W) in place of the captured ones (a hung collective: 100 % at a fraction of the limit).
- ``FAKE_SMI_THROTTLE``: the clock event reason mask (``0x44``: the power cap and HW thermal
  slowdown) in place of the captured one.
- ``FAKE_SMI_FAULT_FILE``: a file read at every iteration; while it exists, its first word is a
  fault of GPU 0: ``ecc`` (the uncorrectable volatile ECC count rises to 2), ``remap`` (a row
  remap pending, one uncorrectable row remapped), ``lost`` (nvidia-smi prints the driver's
  "Unable to determine the device handle ... GPU is lost" line in place of its row, and a
  one-shot call exits 15), ``gone`` (the GPU is no longer listed, and the GPUs after it are
  numbered from 0 again, as NVML does), ``reset`` (its utilisation, memory used, temperature
  and power read ``[GPU requires reset]``, as after Xid 79, 48 or 119), ``nvml`` (every call, and
  the running loops, print "Failed to initialize NVML: Driver/library version mismatch" and
  exit 18, as after a driver update).  Once a loop has printed its first GPU iteration,
  ``<fault file>.seen`` is written: a child injects its fault after that, so the monitor has
  read a healthy GPU first (as a fault during a run comes), however slow the machine.

The health fields (remapped rows, retired pages, PCIe link) are not in the CSV captures: their
values come from the ``nvidia-smi -q -x`` captures of the same GPU (``q_xml_*.txt``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

# The field lists the fixtures were captured with (fixtures README: F and A).
GPU_FIELDS = [
    "index",
    "uuid",
    "name",
    "driver_version",
    "pci.bus_id",
    "pstate",
    "utilization.gpu",
    "utilization.memory",
    "memory.total",
    "memory.used",
    "memory.free",
    "temperature.gpu",
    "temperature.memory",
    "power.draw",
    "power.limit",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "fan.speed",
    "clocks_event_reasons.active",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.volatile.total",
    "compute_mode",
    "persistence_mode",
    "mig.mode.current",
    "display_active",
]
#: Health fields and where the ``-q -x`` capture holds them.
XML_FIELDS = {
    "remapped_rows.pending": "remapped_rows/remapped_row_pending",
    "remapped_rows.failure": "remapped_rows/remapped_row_failure",
    "remapped_rows.correctable": "remapped_rows/remapped_row_corr",
    "remapped_rows.uncorrectable": "remapped_rows/remapped_row_unc",
    "retired_pages.pending": "retired_pages/pending_retirement",
    "pcie.link.gen.gpucurrent": "pci/pci_gpu_link_info/pcie_gen/device_current_link_gen",
    "pcie.link.gen.max": "pci/pci_gpu_link_info/pcie_gen/max_link_gen",
    "pcie.link.width.current": "pci/pci_gpu_link_info/link_widths/current_link_width",
    "pcie.link.width.max": "pci/pci_gpu_link_info/link_widths/max_link_width",
}
APP_FIELDS = ["pid", "process_name", "used_gpu_memory", "gpu_uuid", "gpu_bus_id"]
TWO_FIELDS = ["timestamp", "pid", "process_name", "used_gpu_memory", "gpu_uuid"]
GPU_ALIASES = {
    "gpu_bus_id": "pci.bus_id",
    "gpu_uuid": "uuid",
    "clocks.current.sm": "clocks.sm",
    "clocks.current.memory": "clocks.mem",
    "clocks_throttle_reasons.active": "clocks_event_reasons.active",
}
APP_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}
CAPTURED_PID = "886"
TWO_CAPTURED_PIDS = ("417", "447")
SEPARATOR = ", "
GARBAGE = "this is not a row of the query"
#: How nvidia-smi reports a GPU it cannot reach (see the fixtures README), and its exit status.
LOST_LINE = (
    "Unable to determine the device handle for GPU {address}: GPU is lost.  "
    "Reboot the system to recover this GPU"
)
LOST_EXIT = 15
#: What nvidia-smi prints, and its status, after the driver was updated under it.
NVML_MISMATCH = (
    "Failed to initialize NVML: Driver/library version mismatch",
    "NVML library version: 550.90",
)
NVML_MISMATCH_EXIT = 18


def fixtures() -> Path:
    """The H200 captures, kept in the repository beside this file."""
    return Path(__file__).resolve().parent / "fixtures" / "nvidia-smi" / "h200"


def read(name: str) -> str:
    return (fixtures() / name).read_text()


_ROWS: dict[str, list[dict[str, str]]] = {}


def rows(name: str, fields: list[str]) -> list[dict[str, str]]:
    if name not in _ROWS:
        lines = [line for line in read(name).splitlines() if line.strip()]
        _ROWS[name] = [dict(zip(fields, line.split(SEPARATOR), strict=True)) for line in lines]
    return [dict(row) for row in _ROWS[name]]


_XML_VALUES: dict[str, dict[str, str]] = {}


def xml_values(name: str) -> dict[str, str]:
    """The health fields of a ``nvidia-smi -q -x`` capture, as the CSV query prints them."""
    if name in _XML_VALUES:
        return _XML_VALUES[name]
    gpu = ElementTree.fromstring(read(name)).find("gpu")
    assert gpu is not None
    out = {}
    for field, path in XML_FIELDS.items():
        node = gpu.find(path)
        text = (node.text or "").strip() if node is not None else "N/A"
        out[field] = "[N/A]" if text == "N/A" else text.removesuffix("x")
    _XML_VALUES[name] = out
    return out


def units(header_file: str, fields: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Header names and units per field, from a ``--format=csv`` capture."""
    header = read(header_file).splitlines()[0].split(SEPARATOR)
    names, unit = {}, {}
    for field, column in zip(fields, header, strict=True):
        names[field] = column
        if column.endswith("]") and " [" in column:
            unit[field] = column[column.index(" [") + 2 : -1]
    return names, unit


class Fake:
    def __init__(self) -> None:
        self.mode = os.environ.get("FAKE_SMI_MODE", "load")
        self.printed = 0
        self.hang_after = int(os.environ.get("FAKE_SMI_HANG_AFTER", "0"))
        self.rejected = {f for f in os.environ.get("FAKE_SMI_REJECT", "").split(",") if f}
        self.grow = float(os.environ.get("FAKE_SMI_GROW_MIB_PER_S", "0"))
        self.grow_since = float(os.environ.get("FAKE_SMI_GROW_SINCE", time.time()))
        self.bus_id = os.environ.get("FAKE_SMI_BUS_ID")
        self.util = os.environ.get("FAKE_SMI_UTIL")
        self.power = os.environ.get("FAKE_SMI_POWER_W")
        self.throttle = os.environ.get("FAKE_SMI_THROTTLE")
        self.fault_file = os.environ.get("FAKE_SMI_FAULT_FILE")
        self.pids = {
            CAPTURED_PID: os.environ.get("FAKE_SMI_PID", CAPTURED_PID),
            TWO_CAPTURED_PIDS[0]: os.environ.get("FAKE_SMI_PID", TWO_CAPTURED_PIDS[0]),
            TWO_CAPTURED_PIDS[1]: os.environ.get("FAKE_SMI_PID2", TWO_CAPTURED_PIDS[1]),
        }

    # -- output ------------------------------------------------------------------------

    def emit(self, line: str) -> None:
        if self.mode == "hang" and self.printed >= self.hang_after:
            sys.stdout.flush()
            while True:
                time.sleep(3600)
        sys.stdout.write(line + "\n")
        self.printed += 1

    def fail(self, fixture: str, status: int, old: str = "", new: str = "") -> None:
        text = read(fixture)
        sys.stdout.write(text.replace(old, new) if old else text)
        sys.stdout.flush()
        sys.exit(status)

    # -- data --------------------------------------------------------------------------

    def grown(self, row: dict[str, str], fields: tuple[str, ...]) -> dict[str, str]:
        """``row`` with the memory fields grown by FAKE_SMI_GROW_MIB_PER_S since the start."""
        if not self.grow:
            return row
        extra = int(self.grow * (time.time() - self.grow_since))
        out = dict(row)
        for field in fields:
            if out.get(field, "").strip().isdigit():
                delta = -extra if field == "memory.free" else extra
                out[field] = str(max(0, int(out[field]) + delta))
        return out

    def fault(self) -> str:
        """The fault GPU 0 has now (``FAKE_SMI_FAULT_FILE``), or ""."""
        if not self.fault_file:
            return ""
        try:
            with open(self.fault_file) as f:
                words = f.read().split()
        except OSError:
            return ""
        return words[0] if words else ""

    def gpu_rows(self) -> list[dict[str, str]]:
        idle = self.mode == "idle"
        name = "gpu_idle_csv_nn.txt" if idle else "gpu_load_csv_nn.txt"
        captured = {
            **rows(name, GPU_FIELDS)[0],
            **xml_values("q_xml_idle.txt" if idle else "q_xml_load.txt"),
        }
        if self.util is not None:
            captured["utilization.gpu"] = self.util
        if self.power is not None:
            captured["power.draw"] = self.power
        if self.throttle is not None:
            captured["clocks_event_reasons.active"] = f"0x{int(self.throttle, 16):016x}"
        base = self.bus_id or captured["pci.bus_id"]
        domain, bus, rest = base.split(":")
        fault = self.fault()
        out: list[dict[str, str]] = []
        for i in range(int(os.environ.get("FAKE_SMI_GPUS", "1"))):
            row = dict(captured)
            row["pci.bus_id"] = f"{domain}:{int(bus, 16) + i:02X}:{rest}"
            if i:
                row["index"] = str(i)
                row["uuid"] = f"{captured['uuid'][:-2]}{i:02x}"
            elif fault == "ecc":
                row["ecc.errors.uncorrected.volatile.total"] = "2"
            elif fault == "remap":
                row["remapped_rows.pending"] = "Yes"
                row["remapped_rows.uncorrectable"] = "1"
            elif fault == "lost":
                row = {"lost": LOST_LINE.format(address=row["pci.bus_id"][4:])}
            elif fault == "gone":
                continue
            elif fault == "reset":
                for field in ("utilization.gpu", "memory.used", "temperature.gpu", "power.draw"):
                    row[field] = "[GPU requires reset]"
            if i and fault == "gone":
                row["index"] = str(len(out))
            out.append(row)
        return out

    def app_iterations(self) -> list[list[dict[str, str]]]:
        """What each loop iteration reports (cycled); one-shot calls use the first."""
        if self.mode == "idle":
            return [[]]
        if self.mode == "two":
            groups: dict[str, list[dict[str, str]]] = {}
            # That capture comes from another machine: its processes are put on this GPU.
            first = self.gpu_rows()[0]
            gpu = {"gpu_uuid": first["uuid"], "gpu_bus_id": first["pci.bus_id"]}
            for row in rows("apps_loop_ts.txt", TWO_FIELDS):
                groups.setdefault(row.pop("timestamp"), []).append({**row, **gpu})
            iterations = list(groups.values())
        else:
            iterations = [rows("apps_load.txt", APP_FIELDS)]
        return [[{**row, "pid": self.pids[row["pid"]]} for row in it] for it in iterations]

    # -- queries -----------------------------------------------------------------------

    def query(self, fields: list[str], fmt: str, loop_ms: int | None, gpu: bool) -> None:
        aliases = GPU_ALIASES if gpu else APP_ALIASES
        known = [*GPU_FIELDS, *XML_FIELDS] if gpu else APP_FIELDS
        wanted = [aliases.get(f, f) for f in fields]
        for asked, field in zip(fields, wanted, strict=True):
            if asked in self.rejected or (field not in known and field != "timestamp"):
                self.fail("bogus_field.txt", 2, "not.a.field", asked)
        if self.mode == "no-devices":
            self.fail("bad_id.txt", 6)
        header_file = "gpu_idle_csv.txt" if gpu else "apps_load_hdr.txt"
        names, unit = units(header_file, GPU_FIELDS if gpu else APP_FIELDS)
        options = fmt.split(",")
        if "noheader" not in options:
            self.emit(SEPARATOR.join(names.get(f, f) for f in wanted))
        iterations = [self.gpu_rows()] if gpu else self.app_iterations()
        limit = int(os.environ.get("FAKE_SMI_LOOP_ITERATIONS", "0")) if loop_ms else 1
        start = time.monotonic()
        count = 0
        pid_file = os.environ.get("FAKE_SMI_PID_FILE")
        lost = False
        last_ms = 0
        while not limit or count < limit:
            if self.fault() == "nvml":
                for line in NVML_MISMATCH:
                    self.emit(line)
                sys.stdout.flush()
                sys.exit(NVML_MISMATCH_EXIT)
            if gpu:
                iterations = [self.gpu_rows()]
            if pid_file and not gpu:
                try:
                    with open(pid_file) as f:
                        self.pids[CAPTURED_PID] = f.read().strip()
                    iterations = self.app_iterations()
                except OSError:
                    iterations = [[]]
            # One clock reading per stamp, never the same stamp twice: a loop that fell behind
            # (a loaded machine) prints its late iterations within one millisecond, and lines
            # sharing a stamp are one iteration to the sampler.
            now_ms = max(int(time.time() * 1000), last_ms + 1)
            last_ms = now_ms
            stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now_ms / 1000))
            if not os.environ.get("FAKE_SMI_WHOLE_SECONDS"):
                stamp += f".{now_ms % 1000:03d}"
            for number, row in enumerate(iterations[count % len(iterations)]):
                if number and os.environ.get("FAKE_SMI_ROW_STAMPS"):
                    # Each row stamped as it is read, a millisecond apart.
                    last_ms += 1
                    stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(last_ms / 1000))
                    stamp += f".{last_ms % 1000:03d}"
                memory = ("memory.used", "memory.free") if gpu else ("used_gpu_memory",)
                row = self.grown(row, memory)
                if self.mode == "garbage":
                    self.emit(GARBAGE)
                    continue
                if "lost" in row:
                    self.emit(row["lost"])
                    lost = True
                    continue
                values = []
                for field in wanted:
                    value = stamp if field == "timestamp" else row[field]
                    if "nounits" not in options and field in unit and not value.startswith("["):
                        value = f"{value} {unit[field]}"
                    values.append(value)
                if gpu and number and count % 2 and os.environ.get("FAKE_SMI_TRUNCATE_ROW"):
                    values.pop()
                self.emit(SEPARATOR.join(values))
            sys.stdout.flush()
            if gpu and loop_ms and not count and self.fault_file:
                with open(f"{self.fault_file}.seen", "w"):
                    pass
            count += 1
            if loop_ms is None:
                if lost:
                    sys.exit(LOST_EXIT)
                return
            time.sleep(max(0.0, start + count * loop_ms / 1000 - time.monotonic()))


def main(argv: list[str]) -> int:
    log = os.environ.get("FAKE_SMI_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "argv": argv}) + "\n")
    fake = Fake()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # A healthy nvidia-smi loop ends with status 0 on SIGTERM; a hung one does not react.
    hung = fake.mode == "hang"
    signal.signal(signal.SIGTERM, signal.SIG_IGN if hung else lambda *_: os._exit(0))
    query = fmt = None
    gpu = True
    loop_ms = None
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg.startswith(("--query-gpu=", "--query-compute-apps=", "--query-remapped-rows=")):
            # --query-remapped-rows is answered from the GPU rows (gpu_bus_id, gpu_uuid...).
            gpu = not arg.startswith("--query-compute-apps=")
            query = arg.split("=", 1)[1].split(",")
        elif arg.startswith("--format="):
            fmt = arg.split("=", 1)[1]
        elif arg in ("-lms", "-l") and args:
            loop_ms = int(args.pop(0)) * (1 if arg == "-lms" else 1000)
        elif arg == "--version":
            for line in read("version.txt").splitlines():
                fake.emit(line)
            return 0
        elif arg == "-L":
            for line in read("list.txt").splitlines():
                fake.emit(line)
            return 0
        else:
            print(f"Invalid combination of input arguments: {arg}")
            return 2
    if query is None or fmt is None:
        print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.")
        return 2
    fake.query(query, fmt, loop_ms, gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

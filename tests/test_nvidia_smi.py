"""Reading nvidia-smi's output (the real H200 captures) and the GPU inventory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asyncsoak._process._commands import CommandResult
from asyncsoak._sampling._nvidia_smi import (
    APP_FIELDS,
    ATTENTION_CLOCK_EVENT_REASONS,
    CLOCK_EVENT_REASONS,
    GPU_QUERY,
    GPU_SAMPLE_FIELDS,
    NORMAL_CLOCK_EVENT_REASONS,
    GpuProcess,
    GpuReading,
    SmiParseError,
    data_lines,
    decode_clock_event_reasons,
    gpu_inventory,
    is_error_value,
    line_timestamp,
    needs_attention,
    no_devices,
    parse_gpu_line,
    parse_process_line,
    parse_version,
    query_args,
    rejected_field,
    replace_rejected,
)
from asyncsoak._sampling._snapshot import gpu_section

from .gpu_support import (
    CAPTURED_PID,
    FIXTURE_APP_FIELDS,
    FIXTURE_GPU_FIELDS,
    fixture,
    install_fake_nvidia_smi,
)

H200_UUID = "GPU-ea9029a8-d08e-1132-08a6-ed0bbd671b49"
#: The field list ``apps_loop_ts.txt`` was captured with (the fixtures README).
LOOP_TS_APP_FIELDS = ("timestamp", "pid", "process_name", "used_gpu_memory", "gpu_uuid")


def gpu_rows(name: str, fields: tuple[str, ...] = FIXTURE_GPU_FIELDS) -> list[GpuReading]:
    return [parse_gpu_line(line, fields)[1] for line in data_lines(fixture(name), fields)]


@pytest.mark.parametrize("name", ["gpu_idle_csv_nn.txt", "gpu_idle_csv.txt"])
def test_idle_gpu_row_parses_by_position(name: str) -> None:
    """The idle capture, with or without header and units, gives the same idle H200 reading."""
    (reading,) = gpu_rows(name)
    assert reading.index == 0
    assert reading.uuid == H200_UUID
    assert reading.name == "NVIDIA H200"
    assert reading.bus_id == "00000000:00:06.0"
    assert reading.pstate == "P0"
    assert reading.utilization_gpu_percent == 0.0
    assert reading.memory_total_mib == 143771.0
    assert reading.memory_used_mib == 0.0
    assert reading.power_draw_w == 76.88
    assert reading.power_limit_w == 700.0
    assert reading.clocks_sm_mhz == 345.0
    assert reading.clocks_max_sm_mhz == 1980.0
    assert reading.clock_event_reasons == ["gpu_idle"]
    assert reading.ecc_uncorrected_volatile == 0
    assert reading.ecc_corrected_volatile == 0


@pytest.mark.parametrize("name", ["gpu_load_csv_nn.txt", "gpu_load_csv.txt"])
def test_loaded_gpu_row_shows_the_load_and_power_cap(name: str) -> None:
    """Under load the H200 is at 99 % and 21 GiB, clocks held by its power cap (a normal reason)."""
    (reading,) = gpu_rows(name)
    assert reading.utilization_gpu_percent == 99.0
    assert reading.utilization_memory_percent == 23.0
    assert reading.memory_used_mib == 21363.0
    assert reading.power_draw_w is not None
    assert reading.power_draw_w > 690
    assert reading.clock_event_reasons == ["sw_power_cap"]
    assert not any(needs_attention(r) for r in reading.clock_event_reasons)


@pytest.mark.parametrize("name", ["gpu_idle_csv_nn.txt", "gpu_load_csv.txt"])
def test_not_applicable_value_is_none_with_a_recorded_reason(name: str) -> None:
    """fan.speed of this passively cooled board is [N/A]: None, recorded, and not an error."""
    (reading,) = gpu_rows(name)
    assert reading.fan_speed_percent is None
    assert reading.errors == {"fan.speed": "[N/A]"}
    assert not is_error_value(reading.errors["fan.speed"])


def test_error_and_unparsable_values_become_none_with_errors() -> None:
    """[Unknown Error] and a value that is not a number are None plus an error, never a crash."""
    fields = FIXTURE_GPU_FIELDS
    values = data_lines(fixture("gpu_load_csv_nn.txt"), fields)[0].split(", ")
    values[fields.index("power.draw")] = "[Unknown Error]"
    values[fields.index("temperature.gpu")] = "hot"
    values[fields.index("clocks_event_reasons.active")] = "0xZZ"
    _, reading = parse_gpu_line(", ".join(values), fields)
    assert reading.power_draw_w is None
    assert reading.temperature_gpu_c is None
    assert reading.clock_event_reasons is None
    assert reading.errors["power.draw"] == "[Unknown Error]"
    assert reading.errors["temperature.gpu"] == "unparsable 'hot'"
    assert all(is_error_value(reading.errors[f]) for f in ("power.draw", "temperature.gpu"))
    assert reading.memory_used_mib == 21363.0


@pytest.mark.parametrize(
    "line",
    [
        "Unable to determine the device handle for GPU0000:00:06.0: Unknown Error",
        "",
        "0, 100",
    ],
)
def test_a_line_that_is_not_a_row_raises_parse_error(line: str) -> None:
    """An error message or a torn line is a SmiParseError, which the sampler records."""
    with pytest.raises(SmiParseError):
        parse_gpu_line(line, GPU_SAMPLE_FIELDS)


def test_loop_capture_parses_with_its_short_field_list() -> None:
    """The -lms capture (four fields) gives one reading per period, unasked fields None."""
    fields = ("index", "utilization.gpu", "memory.used", "power.draw")
    readings = gpu_rows("loop_lms.txt", fields)
    assert len(readings) == 9
    assert {r.utilization_gpu_percent for r in readings} <= {99.0, 100.0}
    assert {r.memory_used_mib for r in readings} == {21363.0}
    assert all(r.temperature_gpu_c is None and r.errors == {} for r in readings)


def test_timestamped_gpu_loop_gives_one_timestamp_per_line() -> None:
    """With timestamp first, each iteration of the single-GPU loop has its own timestamp."""
    fields = ("timestamp", "index", "utilization.gpu", "memory.used")
    lines = data_lines(fixture("gpu_loop_ts.txt"), fields)
    stamps = [str(parse_gpu_line(line, fields)[0]) for line in lines]
    assert len(lines) == 68
    assert stamps == sorted(stamps)
    assert len(set(stamps)) == len(stamps)
    assert [line_timestamp(line) for line in lines] == stamps


@pytest.mark.parametrize("name", ["apps_load.txt", "apps_load_hdr.txt"])
def test_loaded_process_row(name: str) -> None:
    """The process under load: pid 886, python3, 21354 MiB on the H200."""
    lines = data_lines(fixture(name), FIXTURE_APP_FIELDS)
    (proc,) = [parse_process_line(line, FIXTURE_APP_FIELDS)[1] for line in lines]
    assert proc.pid == CAPTURED_PID
    assert proc.name == "python3"
    assert proc.used_gpu_memory_mib == 21354.0
    assert proc.gpu_uuid == H200_UUID
    assert proc.gpu_bus_id == "00000000:00:06.0"
    assert not proc.in_tree


def test_the_sampler_places_a_process_by_its_gpus_uuid_and_bus_id() -> None:
    """The compute-apps query asks both identities of the process's GPU, never its index."""
    assert {"gpu_uuid", "gpu_bus_id"} <= set(APP_FIELDS)
    row = "2026/11/29 18:50:44.514, 886, python3, 14, [N/A], 00000000:00:06.0"
    _, proc = parse_process_line(row, APP_FIELDS)
    assert (proc.gpu_uuid, proc.gpu_bus_id) == (None, "00000000:00:06.0")


@pytest.mark.parametrize("value", ["[GPU requires reset]", "[Unknown Error]", "ERR!"])
def test_what_a_gpu_needing_a_reset_reads_is_an_error_value(value: str) -> None:
    """nvidia-smi's readings of a GPU that needs a reset are None, the error kept as printed."""
    fields = FIXTURE_GPU_FIELDS
    values = data_lines(fixture("gpu_load_csv_nn.txt"), fields)[0].split(", ")
    values[fields.index("power.draw")] = value
    _, reading = parse_gpu_line(", ".join(values), fields)
    assert reading.power_draw_w is None
    assert reading.errors["power.draw"] == value
    assert is_error_value(reading.errors["power.draw"])


@pytest.mark.parametrize("garbled", ["", "?", "[Unknown Error]"])
def test_a_row_whose_index_is_garbled_is_read_by_its_identity(garbled: str) -> None:
    """A row whose index cannot be read is still a reading, known by its UUID and bus id
    (index -1 until the sampler matches it); a row with no identity at all is no row."""
    fields = FIXTURE_GPU_FIELDS
    values = data_lines(fixture("gpu_load_csv_nn.txt"), fields)[0].split(", ")
    values[fields.index("index")] = garbled
    _, reading = parse_gpu_line(", ".join(values), fields)
    assert (reading.index, reading.uuid, reading.bus_id) == (-1, H200_UUID, "00000000:00:06.0")
    values[fields.index("uuid")] = values[fields.index("pci.bus_id")] = "[Unknown Error]"
    with pytest.raises(SmiParseError):
        parse_gpu_line(", ".join(values), fields)


@pytest.mark.parametrize("name", ["apps_idle.txt", "apps_after.txt"])
def test_no_process_means_empty_output(name: str) -> None:
    """With no process on the GPU the compute-apps query prints nothing at all."""
    assert data_lines(fixture(name), APP_FIELDS) == []


def test_process_loop_lines_group_by_shared_timestamp() -> None:
    """Lines of one compute-apps iteration share a timestamp: 14 MiB first, then two processes."""
    lines = data_lines(fixture("apps_loop_ts.txt"), LOOP_TS_APP_FIELDS)
    groups: dict[str | None, list[GpuProcess]] = {}
    for line in lines:
        stamp, proc = parse_process_line(line, LOOP_TS_APP_FIELDS)
        assert stamp == line_timestamp(line)
        groups.setdefault(stamp, []).append(proc)
    sizes = [len(g) for g in groups.values()]
    assert (sizes[0], max(sizes), sizes[-1]) == (1, 2, 1)
    first = next(iter(groups.values()))[0]
    assert (first.pid, first.used_gpu_memory_mib) == (417, 14.0)
    both = next(g for g in groups.values() if len(g) == 2)
    assert [(p.pid, p.name, p.used_gpu_memory_mib) for p in both] == [
        (417, "python3", 5638.0),
        (447, "/opt/torch/.venv/bin/python3", 3590.0),
    ]


@pytest.mark.parametrize(
    ("name", "pids"),
    [("loop_apps.txt", {CAPTURED_PID}), ("apps_loop_hdr.txt", {417, 447})],
)
def test_short_process_loops_parse_with_or_without_header(name: str, pids: set[int]) -> None:
    """pid,used_gpu_memory loops parse; a one-time csv header is skipped."""
    fields = ("pid", "used_gpu_memory")
    procs = [parse_process_line(line, fields)[1] for line in data_lines(fixture(name), fields)]
    assert {p.pid for p in procs} == pids
    assert all(p.used_gpu_memory_mib in (21354.0, 5638.0, 3590.0) for p in procs)


def test_process_name_containing_the_separator_is_kept_whole() -> None:
    """A process name with ", " in it does not shift the columns after it."""
    line = data_lines(fixture("apps_loop_ts.txt"), LOOP_TS_APP_FIELDS)[0]
    stamp, pid, _, rest = line.split(", ", 3)
    _, proc = parse_process_line(", ".join([stamp, pid, "train, v2", rest]), LOOP_TS_APP_FIELDS)
    assert proc.name == "train, v2"
    assert proc.used_gpu_memory_mib == 14.0


def test_old_throttle_alias_mask_decodes() -> None:
    """The old clocks_throttle_reasons.active field prints the same mask: 0x1 is gpu_idle."""
    mask = int(fixture("old_throttle.txt").strip(), 16)
    assert decode_clock_event_reasons(mask) == ["gpu_idle"]


def test_every_reason_bit_has_a_name_and_a_verdict() -> None:
    """Each NVML bit decodes by name; unknown bits are kept by value and need attention."""
    assert decode_clock_event_reasons(0x1FF) == list(CLOCK_EVENT_REASONS.values())
    assert decode_clock_event_reasons(0x0) == []
    assert decode_clock_event_reasons(0x48) == ["hw_slowdown", "hw_thermal_slowdown"]
    assert decode_clock_event_reasons(0x400) == ["unknown_0x400"]
    assert set(CLOCK_EVENT_REASONS.values()) == (
        NORMAL_CLOCK_EVENT_REASONS | ATTENTION_CLOCK_EVENT_REASONS
    )
    assert all(needs_attention(r) for r in ATTENTION_CLOCK_EVENT_REASONS)
    assert not any(needs_attention(r) for r in NORMAL_CLOCK_EVENT_REASONS)
    assert needs_attention("unknown_0x400")


def test_bogus_field_is_recognised_and_dropped_or_renamed() -> None:
    """Exit 2, message on stdout: the field is named, then dropped or asked by its old name."""
    result = CommandResult(["nvidia-smi"], 2, fixture("bogus_field.txt"))
    assert rejected_field(result) == "not.a.field"
    assert replace_rejected(["index", "not.a.field"], "not.a.field") == ["index"]
    assert replace_rejected(
        ["index", "clocks_event_reasons.active"], "clocks_event_reasons.active"
    ) == [
        "index",
        "clocks_throttle_reasons.active",
    ]
    assert replace_rejected(["index", "pid"], "index") is None
    assert replace_rejected(["index"], "not.asked") is None
    assert rejected_field(CommandResult(["nvidia-smi"], 0, fixture("gpu_idle_csv.txt"))) is None


def test_no_devices_is_recognised() -> None:
    """Exit 6, "No devices were found", is told apart from other failures."""
    assert no_devices(CommandResult(["nvidia-smi"], 6, fixture("bad_id.txt")))
    assert not no_devices(CommandResult(["nvidia-smi"], 2, fixture("bogus_field.txt")))


def test_version_output_parses() -> None:
    """nvidia-smi --version gives driver, NVML and CUDA versions."""
    assert parse_version(fixture("version.txt")) == {
        "nvidia_smi_version": "580.159.04",
        "nvml_version": "580.159",
        "driver_version": "580.159.04",
        "cuda_version": "13.0",
    }


def test_query_arguments() -> None:
    """Queries are always csv,noheader,nounits; loops add -lms."""
    assert query_args(GPU_QUERY, ["index", "uuid"], 250) == [
        "--query-gpu=index,uuid",
        "--format=csv,noheader,nounits",
        "-lms",
        "250",
    ]


def test_inventory_from_fake_nvidia_smi(tmp_path: Path) -> None:
    """The inventory names the GPUs, their memory and the driver and CUDA versions."""
    fake = install_fake_nvidia_smi(tmp_path, "idle", gpus=2)
    inventory = gpu_inventory(str(fake.path), timeout=10.0)
    assert inventory["available"] is True
    assert inventory["driver_version"] == "580.159.04"
    assert inventory["cuda_version"] == "13.0"
    assert [g["index"] for g in inventory["gpus"]] == [0, 1]
    first = inventory["gpus"][0]
    assert first["name"] == "NVIDIA H200"
    assert first["uuid"] == H200_UUID
    assert first["memory_total_mib"] == 143771.0
    assert first["mig_mode"] == "Disabled"
    assert inventory["errors"] == []


def test_inventory_without_a_field_an_older_driver_lacks(tmp_path: Path) -> None:
    """A field nvidia-smi rejects is left out and recorded; the rest of the inventory stands."""
    fake = install_fake_nvidia_smi(tmp_path, "idle", reject=("mig.mode.current",))
    inventory = gpu_inventory(str(fake.path), timeout=10.0)
    assert inventory["available"] is True
    assert inventory["gpus"][0]["mig_mode"] is None
    assert inventory["gpus"][0]["name"] == "NVIDIA H200"
    assert any("mig.mode.current" in e for e in inventory["errors"])


@pytest.mark.parametrize(("mode", "words"), [("no-devices", "No devices were found")])
def test_inventory_without_gpus(tmp_path: Path, mode: str, words: str) -> None:
    """No GPU: available False and nvidia-smi's reason, not an exception."""
    fake = install_fake_nvidia_smi(tmp_path, mode)
    inventory = gpu_inventory(str(fake.path), timeout=10.0)
    assert inventory["available"] is False
    assert words in inventory["error"]


def test_inventory_without_nvidia_smi(tmp_path: Path) -> None:
    """A missing nvidia-smi gives "no GPU data", not an exception."""
    inventory = gpu_section(str(tmp_path / "nvidia-smi"), timeout=10.0)
    assert inventory == {
        "available": False,
        "error": f"{str(tmp_path / 'nvidia-smi')!r} not found: no GPU data",
    }


@pytest.mark.slow
def test_inventory_of_a_hung_nvidia_smi_is_bounded(tmp_path: Path) -> None:
    """A hung nvidia-smi is killed at the deadline: the inventory says so and returns."""
    fake = install_fake_nvidia_smi(tmp_path, "hang")
    # The fake never answers: a return at all is the deadline at work.
    inventory = gpu_inventory(str(fake.path), timeout=0.5)
    assert inventory["available"] is False
    assert "no answer within 0.5 s" in inventory["error"]


def test_fake_answers_from_a_copy_of_the_repository_alone(tmp_path: Path) -> None:
    """The captures travel with the repository: a copy of tests/ with nothing beside it works."""
    tests_dir = Path(__file__).resolve().parent
    copy = tmp_path / "clone" / "tests"
    shutil.copytree(tests_dir, copy, ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PATH": os.environ.get("PATH", ""), "FAKE_SMI_MODE": "load"}
    query = "--query-gpu=index,name,memory.total"
    result = subprocess.run(
        [sys.executable, "-S", str(copy / "fake_nvidia_smi.py"), query, "--format=csv,noheader"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0, NVIDIA H200, 143771 MiB"


def test_no_test_or_benchmark_reads_outside_the_repository() -> None:
    """Tests and benchmarks name no path above the repository (they must pass on a fresh clone)."""
    root = Path(__file__).resolve().parents[1]
    # Spelled in pieces so that this file does not match itself.
    needles = (".." + "/shared", '"' + 'shared" /', "parents" + "[2]")
    offenders = [
        f"{path.relative_to(root)}: {needle}"
        for folder in ("tests", "benchmarks")
        for path in sorted((root / folder).rglob("*.py"))
        for needle in needles
        if needle in path.read_text()
    ]
    assert offenders == []

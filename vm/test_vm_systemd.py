# `make test-systemd`: the real thing. Boots a small Debian VM (qemu, software
# emulation) from the image vm/build-image caches, installs the package and the
# units from this checkout, and runs vm/run-in-vm there: socket activation,
# kill -9 -> systemd restarts the daemon and recovery runs, a hung writer ->
# the watchdog restarts it, and a store sealed with a key from a credential.
# Then real power cuts: the store on a disk of its own at cache=none, clients
# writing and logging every acknowledgement on the serial console, qemu killed
# with SIGKILL at a random moment, for POWER_ROUNDS rounds; each boot after a cut
# reports what the daemon serves, and the host judges it against the log.
# Needs root, qemu-system-x86_64, debootstrap and mkfs.ext4 (.ci/run installs them).
from __future__ import annotations

import contextlib
import itertools
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VM_TIMEOUT_S = 1500
VM_MEMORY_MIB = 1024
PAYLOAD_DISK = "256M"
DATA_DISK = "512M"
POWER_ROUNDS = 3
POWER_BOOT_TIMEOUT_S = 900
ACKS_BEFORE_CUT = 40  # then a random 0-5 s more before the cut


def _run(*command: str, cwd: Path | None = None) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _payload(work: Path) -> Path:
    payload = work / "payload"
    (payload / "wheels").mkdir(parents=True)
    wheels = str(payload / "wheels")
    _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", wheels, f"{REPO}[daemon]")
    shutil.copytree(REPO / "systemd", payload / "systemd")
    for name in ("run-in-vm", "run-power-cut", "vmcheck.py"):
        shutil.copy(HERE / name, payload / name)
    image = work / "payload.img"
    _run("mkfs.ext4", "-q", "-F", "-d", str(payload), str(image), PAYLOAD_DISK)
    return image


def _findings(serial: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in serial.replace("\r", "").splitlines():
        marker = line.find("VMTEST ")
        if marker < 0:
            continue
        name, _, value = line[marker + len("VMTEST ") :].partition(" ")
        found[name] = value.strip()
    return found


@dataclass
class Machine:
    image_dir: Path
    work: Path
    root: Path  # the root disk's overlay: the first boot installs the package into it
    payload: Path


def _qemu(machine: Machine, serial: Path, root: str, *extra: str, append: str = "") -> list[str]:
    """The disks in this order: root /dev/vda, payload /dev/vdb, then extra ones."""
    return [
        "qemu-system-x86_64",
        "-accel", "tcg,thread=multi",
        "-m", str(VM_MEMORY_MIB),
        "-smp", "2",
        "-display", "none",
        "-no-reboot",
        "-nic", "none",
        "-kernel", str(machine.image_dir / "vmlinuz"),
        "-initrd", str(machine.image_dir / "initrd.img"),
        "-append", f"root=/dev/vda rw console=ttyS0 quiet {append}".strip(),
        "-drive", root,
        "-drive", f"file={machine.payload},if=virtio,format=raw,readonly=on",
        "-serial", f"file:{serial}",
        *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Machine:
    image_dir = Path(_run(str(HERE / "build-image")).strip().splitlines()[-1])
    work = tmp_path_factory.mktemp("vm")
    root = work / "root.qcow2"
    backing = image_dir / "rootfs.img"
    _run("qemu-img", "create", "-q", "-f", "qcow2", "-b", str(backing), "-F", "raw", str(root))
    return Machine(image_dir, work, root, _payload(work))


@pytest.fixture(scope="module")
def vm(machine: Machine) -> Iterator[dict[str, str]]:
    serial = machine.work / "serial.log"
    command = _qemu(machine, serial, f"file={machine.root},if=virtio,format=qcow2")
    with contextlib.suppress(subprocess.TimeoutExpired):  # judged below: no "done"
        subprocess.run(command, capture_output=True, timeout=VM_TIMEOUT_S, check=False)
    text = serial.read_text(errors="replace") if serial.exists() else ""
    findings = _findings(text)
    findings["serial_log"] = str(serial)
    yield findings


def _json(vm: dict[str, str], name: str) -> Any:
    assert name in vm, f"the VM never reported {name}: {vm}"
    return json.loads(vm[name])


def test_the_vm_ran_the_whole_scenario(vm: dict[str, str]) -> None:
    assert "fatal" not in vm, vm
    assert "done" in vm, f"the scenario did not finish (see serial_log): {vm}"
    assert vm["installed"].startswith("sessionstored_")
    assert vm["verify_units"] == "0"


def test_the_key_credential_in_the_unit_is_harmless_without_a_key_file(
    vm: dict[str, str],
) -> None:
    # LoadCredential= alone would fail the start with 243/CREDENTIALS on systemd 252;
    # SetCredential=sessionstored.key:none is its fallback, read by the daemon as no key.
    assert vm["no_key_start_rc"] == "0"
    assert _json(vm, "no_key_hello")["encrypted_at_rest"] is False


def test_socket_activation_starts_the_daemon_on_the_first_client(vm: dict[str, str]) -> None:
    assert vm["socket_active"] == "active"
    assert vm["service_before_first_client"] == "inactive"
    assert vm["service_after_first_client"] == "active"
    assert _json(vm, "save") == {"saved": 20}


def test_a_large_request_is_worked_on_in_a_worker_under_the_sandbox(vm: dict[str, str]) -> None:
    assert _json(vm, "large") == {"large_saved": True}


def test_kill_9_is_restarted_by_systemd_and_recovery_keeps_the_data(vm: dict[str, str]) -> None:
    assert vm["restarted_after_kill"] == "yes"
    assert vm["restarts_added_by_kill"] == "1"
    assert vm["recoveries_added_by_kill"] == "1"  # logged at info priority
    assert _json(vm, "check_after_kill") == {"checked": 20, "wrong": [], "problems": []}


def test_a_hung_writer_trips_the_watchdog(vm: dict[str, str]) -> None:
    assert vm["restarted_after_hang"] == "yes"
    assert int(vm["restarts_added_by_hang"]) >= 1
    assert int(vm["watchdog_logged"]) >= 1
    assert _json(vm, "hung_client")["acknowledged"] is False
    assert _json(vm, "check_after_hang") == {"checked": 20, "wrong": [], "problems": []}


def test_the_key_comes_from_a_credential_and_nothing_is_left_readable(
    vm: dict[str, str],
) -> None:
    assert int(vm["plaintext_files_before_rekey"]) >= 1  # the log segment holding them
    assert vm["rekey_rc"] == "0"
    assert _json(vm, "sealed_hello")["encrypted_at_rest"] is True
    assert _json(vm, "check_sealed") == {"checked": 20, "wrong": [], "problems": []}
    assert vm["plaintext_files_in_state"] == "0"
    assert vm["state_owner"] == "sessionstore"
    assert vm["stop_result"] == "success"


def test_a_sealed_store_without_its_key_file_refuses_to_start(vm: dict[str, str]) -> None:
    assert vm["keyless_start_rc"] != "0"
    assert int(vm["keyless_refusals_logged"]) >= 1
    assert _json(vm, "key_back_check") == {"checked": 20, "wrong": [], "problems": []}


# -- power cuts ------------------------------------------------------------------------


@dataclass
class PowerBoot:
    mode: str
    serial_log: str
    text: str
    findings: dict[str, str] = field(default_factory=dict)


def _boot_until_cut(machine: Machine, serial: Path, data: Path, mode: str) -> PowerBoot:
    """One boot on the store's disk; unless it only checks, qemu is killed with SIGKILL a
    random moment after the clients have ACKS_BEFORE_CUT acknowledgements."""
    command = _qemu(
        machine,
        serial,
        f"file={machine.root},if=virtio,format=qcow2,snapshot=on",  # the root disk stays
        "-drive",
        f"file={data},if=virtio,format=raw,cache=none",
        append=f"sessionstore.power={mode}",
    )
    deadline = time.monotonic() + POWER_BOOT_TIMEOUT_S
    qemu = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while mode != "check" and qemu.poll() is None and time.monotonic() < deadline:
            text = serial.read_text(errors="replace") if serial.exists() else ""
            if "VMTEST fatal" in text:
                break
            if "VMTEST load_started" in text and text.count("VMACK ") >= ACKS_BEFORE_CUT:
                time.sleep(random.uniform(0, 5))
                qemu.send_signal(signal.SIGKILL)  # the power cut
                break
            time.sleep(0.2)
        with contextlib.suppress(subprocess.TimeoutExpired):
            qemu.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if qemu.poll() is None:
            qemu.kill()
            qemu.wait()
    text = serial.read_text(errors="replace") if serial.exists() else ""
    return PowerBoot(mode, str(serial), text, _findings(text))


@pytest.fixture(scope="module")
def power_cuts(machine: Machine, vm: dict[str, str]) -> Iterator[list[PowerBoot]]:
    """The first boot (vm) installed the package into the root disk; these boots keep it
    (snapshot=on) and put the store on a disk of its own, opened with cache=none, which
    needs a file system that takes O_DIRECT (tmpfs does not)."""
    data_dir = Path(tempfile.mkdtemp(prefix="sessionstored-power-", dir="/var/tmp"))
    data = data_dir / "data.img"
    _run("mkfs.ext4", "-q", "-F", str(data), DATA_DISK)
    boots = []
    try:
        for number in range(POWER_ROUNDS + 1):
            mode = "load" if number == 0 else "check" if number == POWER_ROUNDS else "check-load"
            boots.append(_boot_until_cut(machine, machine.work / f"power-{number}.log", data, mode))
            if "fatal" in boots[-1].findings:
                break
        yield boots
    finally:
        shutil.rmtree(data_dir)


def _logged(text: str, tag: str) -> list[dict[str, Any]]:
    """The VMTRY or VMACK records of one boot, in the order they reached the console; a
    line the cut truncated is left out (a truncated VMACK leaves its VMTRY in flight)."""
    records = []
    for line in text.replace("\r", "").splitlines():
        marker = line.find(f"{tag} ")
        if marker < 0:
            continue
        with contextlib.suppress(ValueError):
            records.append(json.loads(line[marker + len(tag) + 1 :]))
    return records


def _owner(key: str) -> int:
    """The worker that alone writes a key: s:pc-W-k or kv:pc/W/k."""
    return int(key.replace("/", "-").split("-")[1])


def judge_power_cut(
    before: dict[str, Any], load_text: str, after: dict[str, Any]
) -> tuple[dict[str, int], list[str]]:
    """What the daemon serves after a cut, against what it served before the load and
    every acknowledgement the load logged: (counts, problems)."""
    acked = dict(before)
    acked_seq, last_acked = 0, {}
    acks = _logged(load_text, "VMACK")
    for ack in acks:
        acked.update(ack["effects"])
        acked_seq = max(acked_seq, ack["seq"])
        last_acked[ack["w"]] = ack["n"]
    in_flight = {}
    for attempt in _logged(load_text, "VMTRY"):
        if attempt["n"] > last_acked.get(attempt["w"], -1):
            in_flight[attempt["w"]] = attempt["effects"]
    served = after["served"]
    problems = []
    for key in sorted(set(acked) | set(served)):
        got, want = served.get(key), acked.get(key)
        flying = in_flight.get(_owner(key), {})
        if got != want and not (key in flying and flying[key] == got):
            problems.append(f"{key}: served {got!r}, acknowledged {want!r}")
    for worker, effects in in_flight.items():
        changed = [key for key, value in effects.items() if value != acked.get(key)]
        landed = {served.get(key) == effects[key] for key in changed}
        if len(landed) > 1:
            problems.append(f"worker {worker}'s request in flight is half applied: {effects}")
    if after["seq"] < acked_seq:
        problems.append(f"seq {after['seq']} is behind the acknowledged {acked_seq}")
    if after["problems"]:
        problems.append(f"verify: {after['problems']}")
    counts = {"acknowledged": len(acks), "in_flight": len(in_flight), "keys": len(served)}
    return counts, problems


def test_power_cuts_lose_nothing_acknowledged_and_apply_nothing_by_half(
    power_cuts: list[PowerBoot], capsys: pytest.CaptureFixture[str]
) -> None:
    assert len(power_cuts) == POWER_ROUNDS + 1, [(b.mode, b.findings) for b in power_cuts]
    before: dict[str, Any] = {}
    for number, (load, check) in enumerate(itertools.pairwise(power_cuts)):
        assert "fatal" not in load.findings and "fatal" not in check.findings, (load, check)
        assert "load_started" in load.findings and "power_done" not in load.findings, load
        assert check.findings["data_disk"] == "/dev/vdc_ext4"
        after = json.loads(check.findings["power_state"])
        counts, problems = judge_power_cut(before, load.text, after)
        with capsys.disabled():
            recovery = check.findings["recovered"]
            print(f"\npower cut {number + 1}: {json.dumps(counts)}; recovery: {recovery}")
        assert problems == [], (check.serial_log, problems)
        assert counts["acknowledged"] >= ACKS_BEFORE_CUT
        before = after["served"]
    assert "power_done" in power_cuts[-1].findings


def _load_log(*lines: tuple[str, dict[str, Any]]) -> str:
    return "".join(f"[  1.0] {tag} {json.dumps(record)}\n" for tag, record in lines)


def test_the_power_cut_judge_tells_lost_half_applied_and_in_flight_apart() -> None:
    """The judge alone, on logs made up here: it must catch what it is there to catch."""
    txn = {"kv:pc/0/1": "r:0:1", "kv:pc/0/2": "r:0:1", "kv:pc/0/3": None}
    log = _load_log(
        ("VMTRY", {"w": 0, "n": 0, "effects": {"s:pc-0-1": "d0"}}),
        ("VMACK", {"w": 0, "n": 0, "seq": 4, "effects": {"s:pc-0-1": "d0"}}),
        ("VMTRY", {"w": 0, "n": 1, "effects": txn}),
    )
    before = {"kv:pc/0/3": "r:0:0"}
    whole_old = {"seq": 4, "problems": [], "served": {"s:pc-0-1": "d0", "kv:pc/0/3": "r:0:0"}}
    whole_new = {"seq": 7, "problems": [], "served": {"s:pc-0-1": "d0", **txn}}
    assert judge_power_cut(before, log, whole_old)[1] == []
    assert (
        judge_power_cut(
            before,
            log,
            {
                **whole_new,
                "served": {k: v for k, v in whole_new["served"].items() if v is not None},
            },
        )[1]
        == []
    )
    lost = {**whole_old, "served": {"kv:pc/0/3": "r:0:0"}}
    assert judge_power_cut(before, log, lost)[1] == ["s:pc-0-1: served None, acknowledged 'd0'"]
    half = {**whole_old, "served": {**whole_old["served"], "kv:pc/0/1": "r:0:1"}}
    assert any("half applied" in p for p in judge_power_cut(before, log, half)[1])
    behind = {**whole_old, "seq": 3}
    assert judge_power_cut(before, log, behind)[1] == ["seq 3 is behind the acknowledged 4"]
    truncated = log + '[  1.1] VMACK {"w": 0, "n": 1, "se'
    assert judge_power_cut(before, truncated, whole_old)[1] == []

# `make test-systemd`: the real thing. Boots a small Debian VM (qemu, software
# emulation) from the image vm/build-image caches, installs the package and the
# units from this checkout, and runs vm/run-in-vm there: socket activation,
# kill -9 -> systemd restarts the daemon and recovery runs, a hung writer ->
# the watchdog restarts it, and a store sealed with a key from a credential.
# Needs root, qemu-system-x86_64, debootstrap and mkfs.ext4 (.ci/run installs them).
from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VM_TIMEOUT_S = 1500
VM_MEMORY_MIB = 1024
PAYLOAD_DISK = "256M"


def _run(*command: str, cwd: Path | None = None) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _payload(work: Path) -> Path:
    payload = work / "payload"
    (payload / "wheels").mkdir(parents=True)
    wheels = str(payload / "wheels")
    _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", wheels, str(REPO))
    shutil.copytree(REPO / "systemd", payload / "systemd")
    for name in ("run-in-vm", "vmcheck.py"):
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


@pytest.fixture(scope="module")
def vm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    image_dir = Path(_run(str(HERE / "build-image")).strip().splitlines()[-1])
    work = tmp_path_factory.mktemp("vm")
    payload = _payload(work)
    root = work / "root.qcow2"
    backing = image_dir / "rootfs.img"
    _run("qemu-img", "create", "-q", "-f", "qcow2", "-b", str(backing), "-F", "raw", str(root))
    serial = work / "serial.log"
    command = [
        "qemu-system-x86_64",
        "-accel", "tcg,thread=multi",
        "-m", str(VM_MEMORY_MIB),
        "-smp", "2",
        "-display", "none",
        "-no-reboot",
        "-nic", "none",
        "-kernel", str(image_dir / "vmlinuz"),
        "-initrd", str(image_dir / "initrd.img"),
        "-append", "root=/dev/vda rw console=ttyS0 quiet",
        "-drive", f"file={root},if=virtio,format=qcow2",
        "-drive", f"file={payload},if=virtio,format=raw",
        "-serial", f"file:{serial}",
    ]  # fmt: skip
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

"""What the eBPF probes need: each missing piece gives one actionable line; bcc loads from the venv."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainprobe.probes.support import bcc_support as bs
from tests.bcc_helpers import READY, needs_ebpf, needs_root
from tests.helpers import REPO

TPS = ("sched:sched_switch", "raw_syscalls:sys_enter")


def fake_root(tmp_path: Path, distro: str = "debian", tracefs: bool = False, headers: bool = False,
              release: str = "6.9.0-1-amd64") -> Path:
    (tmp_path / "etc").mkdir(parents=True, exist_ok=True)
    (tmp_path / "etc" / "os-release").write_text(
        {"debian": 'ID=debian\nVERSION_ID="12"\n', "fedora": "ID=fedora\n", "ubuntu": "ID=ubuntu\nID_LIKE=debian\n"}
        [distro])
    (tmp_path / "sys" / "kernel" / "tracing").mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc" / "self").mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc" / "self" / "status").write_text("CapEff:\t000001ffffffffff\n")
    if tracefs:
        for tp in TPS:
            (tmp_path / "sys" / "kernel" / "tracing" / "events" / tp.replace(":", "/")).mkdir(parents=True)
    if headers:
        (tmp_path / "lib" / "modules" / release / "build" / "include").mkdir(parents=True)
    return tmp_path


def test_missing_headers_name_the_distro_package_for_the_running_release(tmp_path):
    root = fake_root(tmp_path, "debian", tracefs=True, headers=False)
    r = bs.readiness(TPS, root=str(root), release="6.9.0-1-amd64")
    lines = [m for m in r.missing if "headers" in m]
    assert len(lines) == 1
    assert "apt-get install linux-headers-6.9.0-1-amd64" in lines[0]


def test_fedora_headers_advice_is_kernel_devel(tmp_path):
    root = fake_root(tmp_path, "fedora", tracefs=True, headers=False)
    r = bs.readiness(TPS, root=str(root), release="6.8.5-301.fc40.x86_64")
    assert any("dnf install kernel-devel-6.8.5-301.fc40.x86_64" in m for m in r.missing)


def test_present_headers_and_tracefs_are_not_reported_missing(tmp_path):
    root = fake_root(tmp_path, "ubuntu", tracefs=True, headers=True)
    r = bs.readiness(TPS, root=str(root), release="6.9.0-1-amd64")
    assert not any("headers" in m or "tracefs" in m for m in r.missing), r.missing


def test_missing_tracepoint_is_named(tmp_path):
    root = fake_root(tmp_path, tracefs=True, headers=True)
    r = bs.readiness(TPS + ("sched:sched_wakeup",), root=str(root), release="6.9.0-1-amd64")
    assert any("sched:sched_wakeup" in m and "sched_switch" not in m for m in r.missing)


def test_unmounted_tracefs_is_mounted_by_root_or_explained(tmp_path):
    root = fake_root(tmp_path, tracefs=False, headers=True)
    r = bs.readiness(TPS, root=str(root), release="6.9.0-1-amd64")
    if os.geteuid() == 0:
        assert r.will_mount_tracefs and not any("tracefs" in m for m in r.missing)
    else:
        assert any("mount -t tracefs" in m for m in r.missing)


def test_disabled_by_environment_is_one_line(monkeypatch):
    monkeypatch.setenv(bs.DISABLE_ENV, "1")
    r = bs.readiness(TPS)
    assert not r.ok and len(r.missing) == 1
    assert bs.DISABLE_ENV in r.reason and "schedstat" in r.reason


def test_not_root_is_told_to_use_sudo():
    # The checkout and this environment's site-packages (psutil) for an interpreter of the same version.
    paths = [str(REPO)] + [p for p in sys.path if p.endswith("site-packages") and os.access(p, os.R_OK)]
    code = ("import sys; sys.path[:0] = %r; from trainprobe.probes.support import bcc_support as bs; "
            "print(bs.readiness(('sched:sched_switch',)).reason)" % paths)
    if os.geteuid() != 0:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    else:
        # The venv's interpreter lives under /root; the system one runs as any user (bcc_support
        # needs nothing outside the standard library).
        exe = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else None
        if exe is None:
            pytest.skip("no system python3 to run as an unprivileged user")
        out = subprocess.run([exe, "-c", code], capture_output=True, text=True, user=65534, group=65534,
                             extra_groups=[], cwd="/", env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "needs root" in out.stdout and "sudo" in out.stdout


def test_bcc_loads_into_the_venv_without_putting_dist_packages_on_sys_path():
    if bs.bcc_package_dir() is None:
        with pytest.raises(bs.Unavailable) as e:
            bs.import_bcc()
        assert "python3-bpfcc" in str(e.value) or "bcc" in str(e.value)
        return
    code = ("import sys; sys.path.insert(0, %r); from trainprobe.probes.support import bcc_support as bs; m = bs.import_bcc(); "
            "print(m.BPF.__module__, any('dist-packages' in p for p in sys.path))" % str(REPO))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["bcc", "False"]


def test_heavy_imports_stay_out_of_the_cli_startup():
    code = ("import sys; sys.path.insert(0, %r); import agent.cli, probes.registry as r; "
            "[c() for c in r.probe_classes()]; print('bcc' in sys.modules)" % str(REPO))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_format_parsing_and_struct_layout_on_this_kernels_tracefs():
    if READY.facts.get("tracefs") is None:
        pytest.skip("tracefs not mounted here")
    text = Path(READY.facts["tracefs"], "events", "sched", "sched_switch", "format").read_text()
    fmt = bs.parse_format(text)
    names = [f["name"] for f in fmt["fields"]]
    assert {"prev_pid", "prev_state", "next_pid"} <= set(names)
    st = bs.c_struct("sw", fmt)
    assert "prev_comm[16]" in st and "next_pid;" in st
    rm = bs.task_report_max(fmt)
    assert rm > 0x40 and rm & (rm - 1) == 0           # a single bit above the task-state bits


def test_report_max_from_an_older_kernels_print_fmt():
    # 4.19's sched_switch print fmt: TASK_REPORT is 0x7f there too, so the preempt bit is 0x100.
    pf = ('print fmt: "prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%s%s ==> next_comm=%s", REC->prev_comm, '
          'REC->prev_pid, REC->prev_prio, (REC->prev_state & ((((0x0000 | 0x0001 | 0x0002 | 0x0004 | 0x0008 | '
          '0x0010 | 0x0020 | 0x0040) + 1) << 1) - 1)) ? __print_flags(...) : "R", REC->prev_state & (((0x0000 | '
          '0x0001 | 0x0002 | 0x0004 | 0x0008 | 0x0010 | 0x0020 | 0x0040) + 1) << 1) ? "+" : "", REC->next_comm')
    assert bs.task_report_max(bs.parse_format(pf)) == 0x100
    assert bs.task_report_max({"print_fmt": pf.replace("0x0040", "0x0040 | 0x0080")}) == 0x200


def test_misaligned_field_becomes_bytes():
    fmt = {"fields": [{"name": "a", "type": "u8", "offset": 0, "size": 1, "signed": False, "array": False},
                      {"name": "b", "type": "long", "offset": 1, "size": 8, "signed": True, "array": False}]}
    st = bs.c_struct("x", fmt)
    assert "u8 b[8];" in st


@needs_root
def test_tracefs_is_mounted_when_absent_and_said_on_stderr(tmp_path, capfd):
    mnt = tmp_path / "tracing"
    mnt.mkdir()
    said = []
    try:
        where, mounted = bs.ensure_tracefs("/", mountpoint=str(mnt), say=said.append)
        assert mounted and where == str(mnt)
        assert (mnt / "events" / "sched" / "sched_switch" / "format").exists()
        assert said and "mounted tracefs" in said[0]
        again, mounted2 = bs.ensure_tracefs("/", mountpoint=str(mnt), say=said.append)
        assert not mounted2 and len(said) == 1          # already there: nothing done, nothing said
    finally:
        if (mnt / "events").exists():
            bs.umount(str(mnt))


@needs_ebpf
def test_bpf_stats_can_be_enabled_for_the_window_only():
    fd = bs.enable_bpf_stats()
    assert fd is not None and fd >= 0
    os.close(fd)

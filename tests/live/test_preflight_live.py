"""`trainprobe preflight` on this machine: its host reads cross-checked against nproc, getconf, free,
df, ulimit and numactl; exit codes and --slurm under real resource limits; a read that really hangs;
the active tier's child process; save and replay."""
from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import time

import pytest

from tests.helpers import PY, REPO, CliResult
from tests.preflight_fixtures import tree

MiB = 1 << 20


def cli(*args, limits=None, env=None, timeout=120):
    """Run the real CLI; `limits` sets resource limits in the child first ({RLIMIT_X: (soft, hard)})."""
    def pre():
        for res, val in (limits or {}).items():
            resource.setrlimit(res, val)
    e = dict(os.environ, NO_COLOR="1")
    e.update(env or {})
    p = subprocess.run([PY, "-m", "trainprobe.agent", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                       env=e, preexec_fn=pre)
    return CliResult(p.returncode, p.stdout, p.stderr)


def sh(cmd):
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=True).stdout


def by_check(rep):
    return {(c["check"], c["target"]): c for c in rep["checks"]}


def limits_profile(tmp_path, name, **over):
    """A profile this machine can satisfy: limits may only be lowered here (no CAP_SYS_RESOURCE), so the
    expectations are its hard limits, and each test lowers a soft limit below them."""
    ml = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    nf = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    # Any governor: this VM has no cpufreq, where a profile that names one reads unknown.
    prof = {"name": name, "host": {"memlock_gib": -1.0 if ml == resource.RLIM_INFINITY else ml / (1 << 30),
                                   "min_nofile": 65536 if nf == resource.RLIM_INFINITY else min(nf, 65536),
                                   "governors": []}}
    for sec, vals in over.items():
        prof.setdefault(sec, {}).update(vals)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(prof))
    return str(path)


def at_hard(*res):
    return {r: (resource.getrlimit(r)[1], resource.getrlimit(r)[1]) for r in res}


HEALTHY_LIMITS = at_hard(resource.RLIMIT_MEMLOCK, resource.RLIMIT_NOFILE)


@pytest.fixture(scope="module")
def live():
    r = cli("preflight", "--json", "--disk", "/tmp")
    return r, r.json()


def test_host_reads_match_the_standard_tools(live):
    r, rep = live
    c = by_check(rep)
    # CPUs: online as getconf counts them, and the job's CPUs as nproc (affinity) counts them.
    assert c[("host.cpus_online", None)]["value"] == int(sh("getconf _NPROCESSORS_ONLN"))
    job = c[("host.cpus_online", None)]["details"]["job_cpus"]
    from trainprobe.probes.parsers.procfs import parse_cpulist
    assert len(parse_cpulist(job)) == int(sh("nproc"))
    # Memory and swap as free -b reports them.
    free = {ln.split()[0].rstrip(":"): [int(x) for x in ln.split()[1:]] for ln in sh("free -b").splitlines()[1:]}
    assert c[("host.memory", None)]["details"]["MemTotal"] == free["Mem"][0]
    assert c[("host.swap", None)]["details"]["SwapTotal"] == free["Swap"][0]
    # Disks and /dev/shm as df reports them (available space moves a little while other tests run).
    for path in ("/", "/tmp"):
        size, avail = (int(x) for x in sh(f"df -B1 --output=size,avail {path} | tail -1").split())
        d = c[("host.disk", path)]["details"]
        assert d["total"] == size
        assert abs(d["avail"] - avail) < max(512 * MiB, 0.02 * avail)
    shm_size = int(sh("df -B1 --output=size /dev/shm | tail -1"))
    assert c[("host.shm", None)]["value"] == shm_size
    # Limits as the shell's ulimit reports them (the CLI and the shell inherit the same ones).
    ul = sh("ulimit -l").strip()
    assert c[("host.memlock", None)]["value"] == (-1 if ul == "unlimited" else int(ul) * 1024)
    assert c[("host.nofile", None)]["value"] == int(sh("ulimit -n"))


@pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl is not installed")
def test_numa_matches_numactl(live):
    _, rep = live
    out = sh("numactl -H")
    n = int(re.search(r"available: (\d+) nodes", out).group(1))
    c = by_check(rep)[("host.numa_nodes", None)]
    assert c["value"] == n
    from trainprobe.probes.parsers.procfs import parse_cpulist
    for node, cpus in re.findall(r"node (\d+) cpus: ([\d ]+)", out):
        assert parse_cpulist(c["details"]["nodes"][node]) == [int(x) for x in cpus.split()]


def test_no_gpu_here_is_unknown_not_ok(live):
    r, rep = live
    c = by_check(rep)[("gpu.count", None)]
    assert c["status"] == "unknown"
    assert "no NVIDIA driver" in c["observed"]
    assert not [x for x in rep["checks"] if x["category"] == "gpu" and x["status"] == "ok"]
    assert r.rc == {"ok": 0, "warn": 1, "critical": 2, "unknown": 3}[rep["status"]]
    assert rep["exit_code"] == r.rc


def test_exit_codes_and_slurm_under_real_limits(tmp_path):
    gpu_node = limits_profile(tmp_path, "gpu-node")
    cpu_only = limits_profile(tmp_path, "cpu-only", gpu={"count": 0})
    rdma = limits_profile(tmp_path, "rdma", gpu={"count": 0}, host={"memlock_status": "critical"})
    # Limits as the profile wants them, GPUs expected but none here: unknown (3); Slurm lets the node run (0).
    r = cli("preflight", "--profile", gpu_node, limits=HEALTHY_LIMITS)
    assert r.rc == 3, r.out
    r = cli("preflight", "--profile", gpu_node, "--slurm", limits=HEALTHY_LIMITS)
    assert r.rc == 0 and r.out.strip() == "trainprobe: node unknown (gpu.count)"
    # A CPU-only profile: every check ok, and no GPU check runs.
    r = cli("preflight", "--profile", cpu_only, "--json", limits=HEALTHY_LIMITS)
    rep = r.json()
    assert r.rc == 0 and rep["status"] == "ok", [c for c in rep["checks"] if c["status"] != "ok"]
    assert not [c for c in rep["checks"] if c["category"] == "gpu"]
    # A low open-files soft limit warns: 1, and 0 for Slurm.
    nf_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    low_nofile = {**HEALTHY_LIMITS, resource.RLIMIT_NOFILE: (256, nf_hard)}
    r = cli("preflight", "--profile", cpu_only, limits=low_nofile)
    assert r.rc == 1 and "open-files limit 256" in r.out and "(the hard limit allows it)" in r.out
    assert cli("preflight", "--profile", cpu_only, "--slurm", limits=low_nofile).rc == 0
    # memlock at the common 64 KiB default on a node that needs RDMA: critical, 2 in both policies,
    # and the drain reason is one line with the prefix.
    ml_hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    low_memlock = {**HEALTHY_LIMITS, resource.RLIMIT_MEMLOCK: (65536, ml_hard)}
    r = cli("preflight", "--profile", rdma, "--slurm", limits=low_memlock)
    assert r.rc == 2
    assert r.out.count("\n") == 1 and r.out.startswith("trainprobe: host.memlock: RLIMIT_MEMLOCK is 64 KiB")
    r = cli("preflight", "--profile", rdma, "--json", limits=low_memlock)
    assert r.rc == 2 and r.json()["drain_reason"].startswith("trainprobe: host.memlock")


def test_a_hanging_read_does_not_hang_preflight(tmp_path):
    root = tree("base", tmp_path / "root")
    (root / "proc/meminfo").unlink()
    os.mkfifo(root / "proc/meminfo")          # open() blocks until a writer comes: none will
    fast = tmp_path / "fast.json"
    fast.write_text(json.dumps({"timeouts": {"host_read_s": 1.0}}))
    t0 = time.monotonic()
    r = cli("preflight", "--json", "--profile", str(fast), env={"TRAINPROBE_ROOT": str(root)}, timeout=60)
    elapsed = time.monotonic() - t0
    rep = r.json()
    c = by_check(rep)
    for name in ("host.memory", "host.swap"):
        assert c[(name, None)]["status"] == "unknown" and c[(name, None)]["timed_out"]
        assert "/proc/meminfo did not answer within 1 s" in c[(name, None)]["message"]
    # The other reads went on: the tree's /dev/shm line (24 GiB) was read and judged.
    assert c[("host.shm", None)]["status"] == "ok" and not c[("host.shm", None)]["timed_out"]
    assert elapsed < 20


def test_active_tier_here_says_why_it_cannot_run(tmp_path):
    r = cli("preflight", "--active", "--json", "--skip", "host", "--skip", "trainprobe")
    rep = r.json()
    active = [c for c in rep["checks"] if c["category"] == "active"]
    assert {c["check"] for c in active} == {"active.matmul", "active.gemm", "active.h2d_bandwidth",
                                            "active.d2h_bandwidth"}
    assert all(c["status"] == "unknown" and "no CUDA device" in c["message"] for c in active)
    assert r.rc == 3


def test_gpubench_child_runs_and_is_killed_on_timeout():
    import threading

    import psutil

    from trainprobe.probes import gpubench
    from trainprobe.probes.base import Capture, Recorder
    from trainprobe.probes.errors import TimedOut
    rec = Recorder(Capture("gpubench"), threading.Event())
    res = gpubench.run_child(rec, None, 120, gemm_n=256, gemm_seconds=0.2, device="cpu")
    assert rec.capture.provenance[0]["rc"] == 0 and "trainprobe.probes.gpubench" in rec.capture.provenance[0]["what"]
    dev = res["devices"][0]
    assert dev["matmul"]["finite"] and dev["matmul"]["max_rel_error"] < 1e-4
    assert dev["gemm"]["tflops"] > 0 and dev["gemm"]["seconds"] >= 0.2
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    t0 = time.monotonic()
    with pytest.raises(TimedOut, match="killed"):
        gpubench.run_child(rec, None, 0.2, device="cpu")   # importing torch alone takes longer
    assert time.monotonic() - t0 < 5
    time.sleep(0.2)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_save_and_replay_give_the_same_verdicts(tmp_path):
    raw = tmp_path / "raw.json"
    r1 = cli("preflight", "--json", "--save-raw", str(raw))
    r2 = cli("preflight", "--json", "--replay", str(raw))
    a, b = r1.json(), r2.json()
    assert [(c["check"], c["target"], c["status"], c["observed"]) for c in a["checks"]] == \
        [(c["check"], c["target"], c["status"], c["observed"]) for c in b["checks"]]
    assert r1.rc == r2.rc and b["replayed_from"] == str(raw)
    saved = json.loads(raw.read_text())
    assert saved["schema"] == "trainprobe.preflight.raw/1" and "meminfo" in saved["reads"]


def test_saved_bundle_replays_the_same_verdicts(tmp_path):
    """--save writes the probes' captures as a bundle; --replay judges them again offline."""
    saved = tmp_path / "preflight.tar.gz"
    r1 = cli("preflight", "--json", "--save", str(saved), "--disk", "/tmp")
    assert "saved the reads to" in r1.err
    r2 = cli("preflight", "--json", "--replay", str(saved))
    a, b = r1.json(), r2.json()
    assert [(c["check"], c["target"], c["status"], c["observed"], c["value"]) for c in a["checks"]] == \
        [(c["check"], c["target"], c["status"], c["observed"], c["value"]) for c in b["checks"]]
    assert r1.rc == r2.rc == a["exit_code"] and b["replayed_from"] == str(saved)
    assert b["host"] == a["host"] and b["tiers"] == a["tiers"]
    assert oct(saved.stat().st_mode & 0o777) == "0o600"
    from trainprobe.agent import bundle
    caps = {c.probe: c for c in bundle.load(str(saved)).captures}
    assert set(caps) == {"host", "gpuhealth"}
    assert caps["host"].artifacts["meminfo"].startswith("MemTotal:")
    assert any(p["what"] == "/proc/meminfo" and p["kind"] == "file" for p in caps["host"].provenance)
    # A stricter profile given at replay judges the same reads again.
    strict = tmp_path / "strict.json"
    strict.write_text(json.dumps({"host": {"min_nofile": 1 << 30}}))
    r3 = cli("preflight", "--json", "--replay", str(saved), "--profile", str(strict))
    assert by_check(r3.json())[("host.nofile", None)]["status"] in ("warn", "critical")
    # Both together, or a diagnosis bundle, are refused as bad input.
    assert cli("preflight", "--save", str(tmp_path / "x.tar.gz"), "--replay", str(saved)).rc == 3


def test_table_and_bad_input(tmp_path):
    r = cli("preflight")
    assert "STATUS" in r.out and "host.shm" in r.out and re.search(r"exit \d \(nagios\)", r.out)
    v = cli("preflight", "--verbose")
    assert "fix:" in r.out and v.out.count("\n") > r.out.count("\n")
    for args, text in ((["--gpus", "x"], "is not a list"), (["--replay", str(tmp_path / "none.json")], "cannot read"),
                       (["--profile", "h100-9gpu"], "no profile named"), (["--bogus"], "No such option")):
        b = cli("preflight", *args)
        assert b.rc == 3, (args, b.rc, b.err)       # bad input is UNKNOWN, never "critical" (2)
        assert "Traceback" not in b.err and text in b.err
    notraw = tmp_path / "x.json"
    notraw.write_text("{}")
    assert "not a preflight raw file" in cli("preflight", "--replay", str(notraw)).err


def test_prometheus_option_writes_a_parsable_file(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families
    out = tmp_path / "preflight.prom"
    r = cli("preflight", "--prometheus", str(out), "--json")
    fams = {f.name: f for f in text_string_to_metric_families(out.read_text())}
    assert len(fams["trainprobe_preflight_check_status"].samples) == len(r.json()["checks"])
    assert fams["trainprobe_preflight_exit_code"].samples[0].value == r.rc


def test_slurm_healthcheck_wrapper_drains_and_resumes_only_its_own(tmp_path):
    """scripts/slurm-healthcheck.sh with sinfo and scontrol stubbed at the Slurm boundary (no Slurm here)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol.calls"
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {calls}\n')
    (bin_dir / "sinfo").write_text('#!/bin/sh\nprintf "%s\\n" "$CURRENT_REASON"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    cpu_only = limits_profile(tmp_path, "cpu-only", gpu={"count": 0})
    rdma = limits_profile(tmp_path, "rdma", gpu={"count": 0}, host={"memlock_status": "critical"})
    ml_hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]

    def wrapper(profile, current, limits):
        calls.unlink(missing_ok=True)
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", TRAINPROBE=f"{PY} -m trainprobe.agent",
                   TRAINPROBE_PREFLIGHT_ARGS=f"--profile {profile}", CURRENT_REASON=current, SLURMD_NODENAME="n1")

        def pre():
            for res, val in limits.items():
                resource.setrlimit(res, val)
        p = subprocess.run(["sh", str(REPO / "scripts/slurm-healthcheck.sh")], cwd=REPO, env=env, timeout=120,
                           capture_output=True, text=True, preexec_fn=pre)
        assert p.returncode == 0
        return calls.read_text().splitlines() if calls.exists() else []

    low = {**HEALTHY_LIMITS, resource.RLIMIT_MEMLOCK: (65536, ml_hard)}
    got = wrapper(rdma, "", low)
    assert len(got) == 1 and got[0].startswith("update NodeName=n1 State=DRAIN Reason=trainprobe: host.memlock:")
    # Healthy again: it resumes the node it drained, and leaves an administrator's drain alone.
    assert wrapper(cpu_only, "trainprobe: host.memlock: RLIMIT_MEMLOCK is 64 KiB", HEALTHY_LIMITS) == \
        ["update NodeName=n1 State=RESUME"]
    assert wrapper(cpu_only, "fan 3 noisy [admin@2026-01-01]", HEALTHY_LIMITS) == []


def test_as_an_unprivileged_user(tmp_path):
    """Without root the kernel log cannot be read: unknown with the fix, never a silent ok."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another user")
    exe = "/usr/bin/python3"
    import sys
    ver = subprocess.run([exe, "-c", "import sys;print(sys.version_info[:2])"], capture_output=True, text=True) \
        if os.path.exists(exe) else None
    if ver is None or ver.stdout.strip() != str(sys.version_info[:2]):
        pytest.skip("no system python3 of the same version to run as an unprivileged user")
    site = [p for p in sys.path if p.endswith("site-packages")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO)] + site), NO_COLOR="1", HOME="/tmp")
    p = subprocess.run([exe, "-m", "trainprobe.agent", "preflight", "--json"], cwd="/tmp", capture_output=True, text=True,
                       env=env, user=65534, group=65534, extra_groups=[], timeout=120)
    c = by_check(json.loads(p.stdout))
    restrict = open("/proc/sys/kernel/dmesg_restrict").read().strip()
    if restrict == "1":
        kl = c[("host.kernel_log", None)]
        assert kl["status"] == "unknown" and "dmesg_restrict=1" in kl["message"]
        assert "run preflight as root" in kl["remediation"]
    tr = c[("trainprobe.tracefs", None)]
    ev = "/sys/kernel/tracing/events"
    if os.path.isdir(ev) and not all(os.stat(d).st_mode & 0o005 == 0o005 for d in ("/sys/kernel/tracing", ev)):
        # Mounted, but root-only: said as such, not as "not mounted".
        assert tr["status"] == "warn" and tr["observed"] == "mounted at /sys/kernel/tracing, not readable"
    assert tr["informational"]
    assert c[("host.cpus_online", None)]["status"] == "ok"       # the rest still runs

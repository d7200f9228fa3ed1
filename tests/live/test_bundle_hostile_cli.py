"""`trainprobe report` on hostile bundles, through the real command line: a PAX header bomb, a
gzip bomb in regular members, deep JSON, a job bundle with planted links. Each run has a hard
timeout and its peak RSS (the child's ru_maxrss, from wait4) is held under a limit; the old reader
took 1-3 GB and 13-90 s on the same bombs (benchmarks/bench_hostile_bundles.py)."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from trainprobe.agent import bundle
from scripts import bundle_craft as craft
from tests.helpers import PY, REPO

RSS_LIMIT_MB = 150
TIMEOUT_S = 60


def report(path: str, *extra: str) -> tuple[int, str, str, float, float]:
    """(exit code, stdout, stderr, peak RSS MB, seconds) of `trainprobe report PATH`."""
    t0 = time.monotonic()
    # A small launcher reaps `report` with wait4 and writes its peak RSS on the last stderr line: a
    # child forked from the test process itself would carry that process's own high-water mark (Linux
    # keeps the pre-exec peak in ru_maxrss), and RUSAGE_CHILDREN the largest of every child reaped.
    launcher = ("import os,subprocess,sys\n"
                "p=subprocess.Popen(sys.argv[1:])\n"
                "_,st,ru=os.wait4(p.pid,0)\n"
                "sys.stderr.write('\\nTP_MAXRSS_KB=%d\\n' % ru.ru_maxrss)\n"
                "sys.exit(os.waitstatus_to_exitcode(st))\n")
    p = subprocess.Popen([PY, "-c", launcher, PY, "-m", "trainprobe.agent", "report", path, *extra], cwd=REPO,
                         env=dict(os.environ, NO_COLOR="1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        p.communicate()
        pytest.fail(f"report {path} ran past {TIMEOUT_S} s")
    text = err.decode()
    head, _, tail = text.rstrip("\n").rpartition("\nTP_MAXRSS_KB=")
    rss = int(tail) / 1024
    err = head.encode()
    return p.returncode, out.decode(), err.decode(), rss, time.monotonic() - t0


def one_line(err: str) -> str:
    assert "Traceback" not in err and "internal error" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    d = tmp_path_factory.mktemp("bombs")
    pax = d / "pax.tar.gz"            # 256 MiB of PAX header (the old reader held it all, then parsed it)
    craft.write_tgz(pax, craft.pax_bomb_parts(256 << 20, craft.member("b/bundle.json", craft.index([])) + craft.END),
                    level=1)
    gz = d / "gzip.tar.gz"            # four listed captures of 255 MiB of spaces each: 1 GiB inflated
    craft.write_tgz(gz, craft.gzip_bomb_parts(255 << 20, 4), level=1)
    return {"pax": str(pax), "gzip": str(gz)}


def test_a_pax_header_bomb_is_refused_with_one_line_in_bounded_memory(bombs):
    assert os.path.getsize(bombs["pax"]) < 4 << 20
    rc, _out, err, rss, secs = report(bombs["pax"])
    assert rc == 2 and "extended (PAX) header of 268,435,456 bytes (at most 64 KiB)" in one_line(err)
    assert rss < RSS_LIMIT_MB and secs < 20, (rss, secs)


def test_a_gzip_bomb_in_regular_members_is_refused_with_one_line_in_bounded_memory(bombs):
    assert os.path.getsize(bombs["gzip"]) < 8 << 20
    rc, _out, err, rss, secs = report(bombs["gzip"])
    assert rc == 2 and "a gzip bomb, not a bundle" in one_line(err)
    assert rss < RSS_LIMIT_MB and secs < 20, (rss, secs)


def test_deep_json_is_one_line_and_exit_2(tmp_path):
    p = tmp_path / "deep.tar.gz"
    deep = '{"window": {"seconds": 1}, "x": ' + '{"x": ' * 980 + "{}" + "}" * 980 + "}"
    text = craft.index([]).decode().replace('"context": {}', '"context": ' + deep)
    craft.write_tgz(p, [craft.member("b/bundle.json", text.encode()), craft.END])
    rc, _out, err, rss, _secs = report(str(p), "--json")
    assert rc == 2 and "bundle.json: nested deeper than 64 levels" in one_line(err)
    assert rss < RSS_LIMIT_MB


def test_a_job_bundle_with_a_planted_link_keeps_the_other_nodes(tmp_path):
    from tests.unit.test_bundle_hostile import job_bundle
    path = job_bundle(tmp_path)
    n2 = os.path.join(path, "nodes", "n2")
    (pid_dir,) = os.listdir(n2)
    victim = os.path.join(n2, pid_dir, "captures", "pyspy.json")
    os.unlink(victim)
    os.symlink("/etc/shadow", victim)
    os.unlink(os.path.join(n2, pid_dir, "report.json"))
    os.mkfifo(os.path.join(n2, pid_dir, "report.json"))
    rc, out, err, rss, secs = report(path, "--json")
    assert rc == 0, err
    import json
    rep = json.loads(out)
    assert {n["node"]: n["status"] for n in rep["nodes"]}["n1"] == "ok"
    assert [r["node"] for r in rep["ranks"]] == ["n1"]
    skipped = [x for x in rep["notes"] if x.startswith("node n2: bundle skipped: ")]
    assert skipped and "symbolic link" in skipped[0], rep["notes"]
    assert "root:" not in out and secs < TIMEOUT_S and rss < RSS_LIMIT_MB


def test_a_job_json_planted_as_a_fifo_or_a_link_to_dev_zero_is_refused(tmp_path):
    from tests.unit.test_bundle_hostile import job_bundle
    path = job_bundle(tmp_path)
    index = os.path.join(path, "job.json")
    os.unlink(index)
    os.symlink("/dev/zero", index)
    rc, _out, err, rss, secs = report(path)
    assert rc == 2 and "job.json: symbolic link" in one_line(err) or "symbolic link" in one_line(err)
    os.unlink(index)
    os.mkfifo(index)
    rc, _out, err, rss, secs = report(path)
    assert rc == 2 and "not a regular file" in one_line(err) and secs < 20
    assert bundle.MAX_MEMBER_BYTES == 256 << 20            # the documented caps

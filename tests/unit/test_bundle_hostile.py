"""Hostile bundles: tar headers, JSON and directories crafted to exhaust or mislead the reader.

Each one is refused with one BundleError line (exit 2 through the CLI, see
tests/live/test_bundle_hostile_cli.py), within bounded memory (tracemalloc's peak, which counts
every bytes object the reader makes) and without following a link, a FIFO or a device."""
from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import time
import tracemalloc

import pytest

from trainprobe.agent import bundle, diagnosis, tarread
from trainprobe.agent.fleet import jobbundle
from trainprobe.probes.base import Capture
from trainprobe.probes.parsers import safejson
from scripts import bundle_craft as craft
from tests.report_fixtures import h200_capture_and_context


def real_files(mode: str = "starved") -> tuple[list[Capture], dict, dict]:
    cap, ctx = h200_capture_and_context(mode)
    rep, _ev = diagnosis.report_from([cap], ctx, {}, [])
    return [cap], ctx, rep


def members_of(tmp_path, mode: str = "starved") -> dict[str, bytes]:
    caps, ctx, rep = real_files(mode)
    d = tmp_path / "src"
    bundle.save(str(d), caps, ctx, rep)
    return {n: (d / n).read_bytes() for n in ["bundle.json", "report.json"] + [f"captures/{c.probe}.json" for c in caps]}


def good_parts(tmp_path) -> list[bytes]:
    return [craft.member(f"b/{n}", data) for n, data in members_of(tmp_path).items()]


def refused(path, match: str, peak_mb: float = 8.0) -> str:
    tracemalloc.start()
    try:
        with pytest.raises(bundle.BundleError, match=match) as exc:
            bundle.load(str(path))
        _cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    msg = str(exc.value)
    assert "\n" not in msg and len(msg) < 400, msg
    assert peak < peak_mb * (1 << 20), f"peak {peak / 2**20:.1f} MiB reading {path}"
    return msg


def test_a_crafted_stream_of_good_members_loads(tmp_path):
    p = tmp_path / "ok.tar.gz"
    craft.write_tgz(p, good_parts(tmp_path) + [craft.END])
    b = bundle.load(str(p))
    assert [c.probe for c in b.captures] == ["pyspy"] and b.context["window"]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_archives_written_by_tarfile_in_every_format_load(tmp_path, fmt):
    files = members_of(tmp_path)
    top = "é-" + "x" * 120 if fmt != tarfile.USTAR_FORMAT else "b"      # PAX path / GNU L long names
    p = tmp_path / "fmt.tar.gz"
    with tarfile.open(p, "w:gz", format=fmt) as tar:
        d = tarfile.TarInfo(top)
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert bundle.load(str(p)).captures[0].probe == "pyspy"


def test_an_archive_made_by_gnu_tar_loads(tmp_path):
    caps, ctx, rep = real_files()
    bundle.save(str(tmp_path / "run"), caps, ctx, rep)
    subprocess.run(["tar", "czf", "run.tar.gz", "run"], cwd=tmp_path, check=True)
    assert bundle.load(str(tmp_path / "run.tar.gz")).report["findings"] == rep["findings"]


def test_a_pax_header_bomb_is_refused_at_its_header(tmp_path):
    p = tmp_path / "pax.tar.gz"
    craft.write_tgz(p, craft.pax_bomb_parts(256 << 20, b"".join(good_parts(tmp_path)) + craft.END), level=1)
    t0 = time.monotonic()
    msg = refused(p, r"extended \(PAX\) header of 268,435,456 bytes \(at most 64 KiB\)")
    assert time.monotonic() - t0 < 2.0, msg


@pytest.mark.parametrize("kind,label", [(b"x", "extended"), (b"g", "extended"), (b"L", "GNU long name"),
                                        (b"K", "GNU long name")])
def test_every_extended_header_kind_is_capped(tmp_path, kind, label):
    p = tmp_path / "ext.tar.gz"
    craft.write_tgz(p, [craft.header("b/././@LongLink", (64 << 10) + 1, typeflag=kind), craft.END])
    refused(p, label)


def test_pax_records_are_checked_one_by_one(tmp_path):
    p = tmp_path / "rec.tar.gz"
    for records, match in [(b"99 path=x\n", "record length"), (b"garbage", "malformed record"),
                           (craft.pax_record("GNU.sparse.map", "0,1"), "sparse"),
                           (craft.pax_record("size", "-5"), "not a number"),
                           (craft.pax_record("path", "/etc/shadow"), "unsafe member name"),
                           (craft.pax_record("path", "a/" * 20 + "bundle.json"), "deeper than 16"),
                           (craft.pax_record("path", "x" * 2000), "longer than 1024")]:
        craft.write_tgz(p, [craft.pax(records), craft.member("b/bundle.json", craft.index([])), craft.END])
        refused(p, match)
    craft.write_tgz(p, [craft.pax(craft.pax_record("path", "b/report.json"), typeflag=b"g"), craft.END])
    refused(p, "global extended header that sets path")


def test_a_pax_size_overrides_the_header_and_is_capped(tmp_path):
    p = tmp_path / "size.tar.gz"
    craft.write_tgz(p, [craft.pax(craft.pax_record("size", str(8 << 30))), craft.header("b/captures/x.json", 0),
                        craft.END])
    refused(p, "larger than 256 MiB")


@pytest.mark.parametrize("field,match", [
    (b"\x80" + (8 << 30).to_bytes(11, "big"), "larger than 256 MiB"),     # base-256, 8 GiB
    (b"\xff" * 12, "negative member size"),
    (b"12zz4\0", "not a number"),
])
def test_declared_sizes_are_checked_before_any_data_is_read(tmp_path, field, match):
    p = tmp_path / "size.tar.gz"
    craft.write_tgz(p, [craft.header("b/captures/pyspy.json", size_field=field), craft.END])
    refused(p, match)


@pytest.mark.parametrize("typeflag,what", [(b"1", "hard link"), (b"2", "symbolic link"), (b"3", "character device"),
                                           (b"4", "block device"), (b"6", "FIFO"), (b"S", "sparse"),
                                           (b"7", "contiguous"), (b"Z", "unknown type")])
def test_links_devices_and_fifos_are_refused_as_members(tmp_path, typeflag, what):
    p = tmp_path / "special.tar.gz"
    craft.write_tgz(p, [craft.member("b/bundle.json", craft.index(["captures/pyspy.json"])),
                        craft.header("b/captures/pyspy.json", typeflag=typeflag, linkname="/etc/shadow"), craft.END])
    refused(p, what)


@pytest.mark.parametrize("name,match", [("/abs/bundle.json", "unsafe"), ("b/../../x/bundle.json", "unsafe"),
                                        ("/".join(["d"] * 17) + "/bundle.json", "deeper than 16"),
                                        (b"b/\xff\xfe.json", "not UTF-8")])
def test_unsafe_member_names_are_refused(tmp_path, name, match):
    p = tmp_path / "name.tar.gz"
    craft.write_tgz(p, [craft.header(name, 0), craft.END])
    refused(p, match)


def test_many_members_bad_checksums_duplicates_and_truncation(tmp_path):
    p = tmp_path / "t.tar.gz"
    craft.write_tgz(p, [craft.header(f"b/d{i}/", typeflag=b"5") for i in range(600)] + [craft.END])
    refused(p, "more than 512 members")
    craft.write_tgz(p, [craft.header("b/bundle.json", 0, checksum=b"0000000\0"), craft.END])
    refused(p, "bad checksum")
    idx = craft.index([])
    craft.write_tgz(p, [craft.member("b/bundle.json", idx), craft.member("b/bundle.json", idx), craft.END])
    refused(p, "appears twice")
    craft.write_tgz(p, [craft.header("b/bundle.json", 5000), b"{" * 100])
    refused(p, "ends inside b/bundle.json")
    with open(p, "wb") as fh:
        fh.write(b"".join(craft.gzip_stream([craft.member("b/bundle.json", idx), craft.END]))[:-20])
    refused(p, "truncated|ends inside")
    p.write_bytes(b"\x1f\x8b\x08\x00garbage")
    refused(p, "not a gzip stream|truncated")


def test_a_gzip_bomb_in_a_regular_member_stops_at_the_ratio_or_the_caps(tmp_path, monkeypatch):
    p = tmp_path / "bomb.tar.gz"
    craft.write_tgz(p, craft.gzip_bomb_parts(200 << 20, 1), level=9)       # 200 MiB of spaces, listed
    assert p.stat().st_size < 1 << 20
    t0 = time.monotonic()
    refused(p, "inflates more than 200:1 past 16 MiB", peak_mb=24)
    assert time.monotonic() - t0 < 20
    # Below the ratio's floor, the caps: a member over its cap is refused at its header, and the
    # members together at the total, whether kept or skipped.
    monkeypatch.setattr(bundle, "MAX_MEMBER_BYTES", 1 << 20)
    monkeypatch.setattr(bundle, "MAX_TOTAL_BYTES", 3 << 20)
    craft.write_tgz(p, craft.gzip_bomb_parts(2 << 20, 1))
    refused(p, "larger than 1 MiB")
    craft.write_tgz(p, craft.gzip_bomb_parts((1 << 20) - 10, 4, name="b/skipped/c{}.bin"))
    refused(p, "larger than 3 MiB in all")


# -- JSON ------------------------------------------------------------------------------------------

def nested(depth: int) -> dict:
    doc: dict = {}
    cur = doc
    for _ in range(depth):
        cur["x"] = {}
        cur = cur["x"]
    return doc


def test_deep_json_anywhere_in_a_bundle_is_refused_with_one_line(tmp_path):
    files = members_of(tmp_path)
    p = tmp_path / "deep.tar.gz"
    idx = json.loads(files["bundle.json"])
    idx["context"]["deep"] = "@"
    text = json.dumps(idx).replace('"@"', '{"x":' * 980 + "{}" + "}" * 980)
    craft.write_tgz(p, [craft.member("b/bundle.json", text.encode()),
                        craft.member("b/captures/pyspy.json", files["captures/pyspy.json"]), craft.END])
    refused(p, "bundle.json: nested deeper than 64 levels")
    cap = json.loads(files["captures/pyspy.json"])
    cap["artifacts"]["chrometrace.json"] = "[" * 5000 + "]" * 5000 + " token"     # `token`: redaction parses it
    craft.write_tgz(p, [craft.member("b/bundle.json", files["bundle.json"]),
                        craft.member("b/captures/pyspy.json", json.dumps(cap).encode()), craft.END])
    refused(p, "artifact chrometrace.json: nested deeper than 64")
    craft.write_tgz(p, [craft.member("b/bundle.json", files["bundle.json"]),
                        craft.member("b/captures/pyspy.json", files["captures/pyspy.json"]),
                        craft.member("b/report.json", b'{"x":' * 5000 + b"{}" + b"}" * 5000), craft.END])
    assert bundle.load(str(p)).report is None            # the live run's report is optional


def test_json_that_would_become_gbs_of_objects_is_refused(tmp_path):
    files = members_of(tmp_path)
    cap = json.loads(files["captures/pyspy.json"])
    cap["artifacts"]["chrometrace.json"] = "[" + "{}," * 2_500_000 + "{}]"
    p = tmp_path / "wide.tar.gz"
    craft.write_tgz(p, [craft.member("b/bundle.json", files["bundle.json"]),
                        craft.member("b/captures/pyspy.json", json.dumps(cap).encode()), craft.END])
    refused(p, "more than 2,000,000 JSON values", peak_mb=60)


@pytest.mark.parametrize("change,match", [
    ({"probe": 5}, "probe"), ({"artifacts": {"chrometrace.json": 1}}, "artifacts"), ({"meta": []}, "meta"),
    ({"seconds": "long"}, "seconds"), ({"provenance": "x"}, "provenance"), ({"probe": "../x"}, "probe"),
])
def test_a_capture_of_the_wrong_shape_is_refused(tmp_path, change, match):
    files = members_of(tmp_path)
    cap = {**json.loads(files["captures/pyspy.json"]), **change}
    p = tmp_path / "shape.tar.gz"
    craft.write_tgz(p, [craft.member("b/bundle.json", files["bundle.json"]),
                        craft.member("b/captures/pyspy.json", json.dumps(cap).encode()), craft.END])
    refused(p, f"not a capture: .*{match}.* of the wrong type")


def test_safejson_depth_is_exact_with_brackets_and_escapes_inside_strings():
    docs = [[], {"a": "[[[[", "b": ["]]]]", {"c": "\\\"{"}]}, ["\\", ["\\\\", [[]]]], {"k\"[": {"}": [1]}}]
    for doc in docs:
        def depth(o):
            return 1 + max((depth(v) for v in (o.values() if isinstance(o, dict) else o)), default=0) \
                if isinstance(o, (dict, list)) else 0
        assert safejson.depth(json.dumps(doc).encode()) == depth(doc)
    # Closing brackets inside strings cannot hide real depth.
    with pytest.raises(safejson.JSONLimitError, match="deeper than 64"):
        safejson.loads('["' + "]" * 500 + '", ' + "[" * 100 + "]" * 100 + "]")
    with pytest.raises(safejson.JSONLimitError, match="not UTF-8"):
        safejson.loads(b'{"a": "\xff"}')
    with pytest.raises(safejson.JSONLimitError, match="not valid JSON"):
        safejson.loads("{")
    assert safejson.loads(b'{"a": [1, "x]"]}') == {"a": [1, "x]"]}


# -- directories: links, FIFOs, devices, hard links --------------------------------------------------

def saved_dir(tmp_path, name: str = "d") -> str:
    caps, ctx, rep = real_files()
    path = str(tmp_path / name)
    bundle.save(path, caps, ctx, rep)
    return path


@pytest.mark.parametrize("plant,match", [
    (lambda p: os.symlink("/etc/shadow", p), "symbolic link"),
    (lambda p: os.symlink("/dev/zero", p), "symbolic link"),
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: os.link("/etc/hostname", p), "hard links"),
])
def test_directory_bundle_members_are_never_followed(tmp_path, plant, match):
    d = saved_dir(tmp_path)
    victim = os.path.join(d, "captures", "pyspy.json")
    os.unlink(victim)
    plant(victim)
    t0 = time.monotonic()
    refused(d, match)
    assert time.monotonic() - t0 < 5                      # a FIFO is never waited on


def test_a_directory_bundle_whose_captures_folder_is_a_link_is_refused(tmp_path):
    d = saved_dir(tmp_path)
    other = saved_dir(tmp_path, "other")
    os.rename(os.path.join(d, "captures"), os.path.join(d, "old"))
    os.symlink(os.path.join(other, "captures"), os.path.join(d, "captures"))
    refused(d, "captures/ is a link")
    os.unlink(os.path.join(d, "bundle.json"))
    os.symlink("/dev/zero", os.path.join(d, "bundle.json"))
    refused(d, "symbolic link")


def job_bundle(tmp_path) -> str:
    payloads = []
    for node, mode, rank in (("n1", "healthy", 0), ("n2", "starved", 1)):
        cap, ctx = h200_capture_and_context(mode)
        rep, _ev = diagnosis.report_from([cap], ctx, {}, [])
        payloads.append({"node": node, "hostname": node, "status": "ok", "reason": None, "exit_code": 0,
                         "targets": [{"target": {"pid": ctx["target"]["pid"], "ranks": [
                                          {"pid": ctx["target"]["pid"], "rank": rank, "local_rank": 0,
                                           "procid": rank}]}, "status": "ok",
                                      "exit_code": 0, "report": rep,
                                      "bundle": {"context": ctx, "captures": [cap.to_dict()]}}]})
    path = str(tmp_path / "job")
    jobbundle.save(path, {"job": {"id": "7", "nodes": ["n1", "n2"]}, "window": {"seconds": 8.3}, "notes": []},
                   payloads)
    return path


def _plant_capture_link(n2, pid_dir, path):
    victim = os.path.join(n2, pid_dir, "captures", "pyspy.json")
    os.unlink(victim)
    os.symlink("/etc/shadow", victim)


def _plant_captures_fifo(n2, pid_dir, path):
    os.rename(os.path.join(n2, pid_dir, "captures"), os.path.join(path, "moved"))
    os.mkfifo(os.path.join(n2, pid_dir, "captures"))


def _plant_loop(n2, pid_dir, path):
    os.rename(n2, os.path.join(path, "moved"))
    os.symlink(".", n2)                                   # nodes/n2 -> nodes: a directory loop


def _plant_hard_link(n2, pid_dir, path):
    victim = os.path.join(n2, pid_dir, "captures", "pyspy.json")
    os.unlink(victim)
    os.link("/etc/hostname", victim)


@pytest.mark.parametrize("plant", [_plant_capture_link, _plant_captures_fifo, _plant_loop, _plant_hard_link])
def test_a_job_bundle_keeps_the_good_nodes_when_one_is_planted(tmp_path, plant):
    path = job_bundle(tmp_path)
    assert [n["status"] for n in jobbundle.rediagnose(path)["nodes"]] == ["ok", "ok"]
    n2 = os.path.join(path, "nodes", "n2")
    (pid_dir,) = os.listdir(n2)
    plant(n2, pid_dir, path)
    t0 = time.monotonic()
    rep = jobbundle.rediagnose(path)
    assert time.monotonic() - t0 < 30
    by = {n["node"]: n for n in rep["nodes"]}
    assert by["n1"]["status"] == "ok" and [r["node"] for r in rep["ranks"]] == ["n1"], rep["ranks"]
    assert [x for x in rep["notes"] if x.startswith("node n2: bundle skipped: ")], rep["notes"]
    assert "root:" not in json.dumps(rep)                 # nothing of /etc/shadow


def test_job_json_as_a_link_a_fifo_or_bad_paths(tmp_path):
    path = job_bundle(tmp_path)
    index = os.path.join(path, "job.json")
    doc = json.loads(open(index).read())
    doc["nodes"][1]["targets"][0]["bundle"] = "../../etc"
    os.unlink(index)
    with open(index, "w") as fh:
        json.dump(doc, fh)
    rep = jobbundle.rediagnose(path)
    assert any("is not nodes/<node>/<pid>" in x for x in rep["notes"])
    assert {n["node"]: n["status"] for n in rep["nodes"]}["n1"] == "ok"
    os.unlink(index)
    os.mkfifo(index)
    t0 = time.monotonic()
    with pytest.raises(bundle.BundleError, match="job.json is not a regular file"):
        jobbundle.rediagnose(path)
    assert time.monotonic() - t0 < 5
    os.unlink(index)
    os.symlink("/dev/zero", index)
    with pytest.raises(bundle.BundleError, match="symbolic link"):
        jobbundle.rediagnose(path)
    os.unlink(index)
    with open(index, "w") as fh:
        json.dump({"schema": jobbundle.SCHEMA, "nodes": [[1], "x"]}, fh)
    with pytest.raises(bundle.BundleError, match="malformed"):
        jobbundle.rediagnose(path)
    with open(index + ".tmp", "w") as fh:
        json.dump({"schema": jobbundle.SCHEMA, "nodes": nested(900)}, fh)
    os.replace(index + ".tmp", index)
    with pytest.raises(bundle.BundleError, match="nested deeper than 64"):
        jobbundle.rediagnose(path)


def test_the_reader_makes_no_file_and_tarread_is_the_only_way_in(tmp_path):
    p = tmp_path / "x.tar.gz"
    craft.write_tgz(p, [craft.member("../escape.json", b"{}"), craft.END])
    before = set(os.listdir(tmp_path.parent))
    refused(p, "unsafe")
    assert set(os.listdir(tmp_path.parent)) == before
    assert "tarfile.open(path" not in open(bundle.__file__).read()     # reading goes through tarread
    assert tarread.MAX_EXT_BYTES == 64 << 10

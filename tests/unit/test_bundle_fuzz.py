"""Property tests of `trainprobe report BUNDLE` on crafted archives: tar headers with random or
damaged fields, type flags, sizes and PAX records, and real bundles whose JSON is reshaped (deep,
wide, huge strings, a type where the schema expects another).

The command runs in this process (the CLI's own entry, trainprobe.agent.cli._run), so a few hundred
examples take seconds. The only outcomes allowed: a report (exit 0, JSON on stdout) or one line on
stderr and exit 2; never a traceback or an internal error, never more than 150 MB of extra peak
memory, never more than a few seconds an example."""
from __future__ import annotations

import contextlib
import io
import json
import random
import resource
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainprobe.agent import bundle, cli, diagnosis
from scripts import bundle_craft as craft
from tests.report_fixtures import h200_capture_and_context

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), database=None)
FUZZ_TAR = settings(FUZZ, max_examples=200)
PER_EXAMPLE_S = 10.0
EXTRA_RSS_MB = 150


class Members(dict):
    def __repr__(self) -> str:            # hypothesis prints its arguments: not 200 kB of trace
        return "<the members of a real bundle>"


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    cap, ctx = h200_capture_and_context("starved")
    rep, _ev = diagnosis.report_from([cap], ctx, {}, [])
    d = tmp_path_factory.mktemp("real") / "b"
    bundle.save(str(d), [cap], ctx, rep)
    return Members({n: (d / n).read_bytes() for n in ("bundle.json", "report.json", "captures/pyspy.json")})


@pytest.fixture
def rss():
    # Per test, not per module: under xdist another module's tests run between this module's on the
    # same worker, and their peak (a replayed GPU bundle) would be counted as the fuzzers' growth.
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    yield
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    assert grew < EXTRA_RSS_MB, f"peak RSS grew by {grew:.0f} MB while fuzzing"


def run_report(path: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli._run(["report", path, "--json"])
    took = time.monotonic() - t0
    o, e = out.getvalue(), err.getvalue()
    assert took < PER_EXAMPLE_S, f"{took:.1f} s on {path}: {e}"
    assert "Traceback" not in e and "internal error" not in e, e
    assert rc in (0, 2), (rc, e)
    if rc == 2:
        lines = [ln for ln in e.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("trainprobe: "), e
    else:
        assert json.loads(o)["command"] == "report"
    return rc, o, e


# -- tar headers -----------------------------------------------------------------------------------

TYPES = [b"0", b"\0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"x", b"g", b"L", b"K", b"S", b"Z"]
PAX_KEYS = ["path", "size", "linkpath", "mtime", "comment", "GNU.sparse.map", "hdrcharset", "uid"]


@st.composite
def size_fields(draw, n: int):
    kind = draw(st.sampled_from(["exact", "exact", "exact", "octal", "base256", "negative", "garbage", "empty"]))
    if kind == "exact":
        return None
    if kind == "octal":
        return craft.octal(draw(st.integers(0, 8 ** 11 - 1)), 12)
    if kind == "base256":
        return b"\x80" + draw(st.integers(0, 2 ** 80)).to_bytes(11, "big")
    if kind == "negative":
        return b"\xff" + draw(st.binary(min_size=11, max_size=11))
    if kind == "garbage":
        return draw(st.binary(min_size=1, max_size=12))
    return b""


@st.composite
def pax_records(draw):
    recs = []
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.sampled_from(PAX_KEYS) | st.text(min_size=1, max_size=10))
        value = draw(st.sampled_from(["b/bundle.json", "b/captures/pyspy.json", "../x", "/etc/shadow", "12",
                                      "-1", "99999999999999999999", "0,1,2"]) | st.text(max_size=40))
        recs.append(craft.pax_record(key.replace("=", ""), value.replace("\n", "")))
    raw = b"".join(recs)
    if draw(st.booleans()):
        raw = draw(st.binary(max_size=60)) + raw            # a damaged record
    return raw


@st.composite
def tar_streams(draw, real):
    names = ["b/bundle.json", "b/report.json", "b/captures/pyspy.json"]
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        typeflag = draw(st.sampled_from(TYPES))
        if typeflag in (b"x", b"g"):
            data = draw(pax_records())
        elif typeflag in (b"L", b"K"):
            data = draw(st.sampled_from(names).map(str.encode) | st.binary(max_size=200)) + b"\0"
        else:
            data = draw(st.sampled_from([real[n[2:]] for n in names]) | st.binary(max_size=300))
        name = draw(st.sampled_from(names + ["b/", "/abs", "b/../x", "b/captures/", "a" * 99])
                    | st.binary(max_size=100))
        hdr = craft.header(name, len(data), typeflag=typeflag, linkname=draw(st.sampled_from([b"", b"/etc/shadow"])),
                           size_field=draw(size_fields(len(data))),
                           magic=draw(st.sampled_from([b"ustar\x0000", b"ustar  \0", b"\0" * 8])),
                           prefix=draw(st.sampled_from([b"", b"b", b"/", b".."])))
        if draw(st.integers(0, 9)) == 0:                    # a damaged checksum now and then
            hdr = hdr[:148] + b"0000000\0" + hdr[156:]
        parts.append(hdr + data + craft.pad(len(data)))
    parts.append(craft.END if draw(st.booleans()) else b"")
    raw = bytearray(b"".join(parts))
    for _ in range(draw(st.integers(0, 3))):                 # flip bytes of the decompressed stream
        if raw:
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    return bytes(raw)


@FUZZ_TAR
@given(data=st.data())
def test_report_on_random_and_damaged_tar_headers(real, rss, tmp_path_factory, data):
    stream = data.draw(tar_streams(real))
    p = tmp_path_factory.mktemp("tar") / "b.tar.gz"
    craft.write_tgz(p, [stream])
    if data.draw(st.integers(0, 9)) == 0:                   # damage the gzip layer too
        raw = bytearray(p.read_bytes())
        raw[data.draw(st.integers(0, len(raw) - 1))] ^= 0xFF
        p.write_bytes(bytes(raw))
    run_report(str(p))


# -- JSON shapes -----------------------------------------------------------------------------------

DEEP = "@@deep@@"


def odd_values(size: int):
    return st.one_of(
        st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=True),
        st.text(max_size=50), st.just("x" * size), st.just(DEEP),
        st.lists(st.integers(), max_size=20), st.dictionaries(st.text(max_size=8), st.integers(), max_size=5),
        st.just(list(range(size // 8))), st.just({str(i): {} for i in range(size // 16)}),
    )


def paths_of(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in list(doc.items())[:40]:
            yield from paths_of(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:10]):
            yield from paths_of(v, prefix + (i,))


def put(doc, path, value):
    if not path:
        return value
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return doc


@FUZZ
@given(data=st.data())
def test_report_on_reshaped_json(real, rss, tmp_path_factory, data):
    member = data.draw(st.sampled_from(["bundle.json", "captures/pyspy.json", "report.json"]))
    doc = json.loads(real[member])
    candidates = list(paths_of(doc))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(candidates))
        try:
            doc = put(doc, path, data.draw(odd_values(data.draw(st.sampled_from([10, 1000, 1 << 18])))))
        except (KeyError, IndexError, TypeError):
            pass
        candidates = list(paths_of(doc))
    depth = data.draw(st.sampled_from([10, 63, 65, 980, 100_000]))
    text = json.dumps(doc).replace(json.dumps(DEEP), "[" * depth + "]" * depth)
    files = dict(real, **{member: text.encode()})
    p = tmp_path_factory.mktemp("json") / "b.tar.gz"
    craft.write_tgz(p, [craft.member(f"b/{n}", d) for n, d in files.items()] + [craft.END])
    rc, out, err = run_report(str(p))
    if depth > 64 and DEEP in json.dumps(doc) and member != "report.json":
        assert rc == 2 and "nested deeper than 64" in err, err


def test_the_fuzzers_reach_both_outcomes(real, tmp_path):
    """The property tests above are worth something only if both outcomes occur: check one of each."""
    ok = tmp_path / "ok.tar.gz"
    craft.write_tgz(ok, [craft.member(f"b/{n}", d) for n, d in real.items()] + [craft.END])
    assert run_report(str(ok))[0] == 0
    bad = tmp_path / "bad.tar.gz"
    craft.write_tgz(bad, [craft.header("b/bundle.json", typeflag=b"2", linkname="/etc/shadow"), craft.END])
    assert run_report(str(bad))[0] == 2
    random.seed(0)

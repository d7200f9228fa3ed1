"""reports/ reads top-down (forms -> renderers -> values), every view writes a value and a verdict the
same way, and every text form writes any string, a lone surrogate included."""
import ast
import re
import io
import json
import subprocess
import sys

import pytest

from trainprobe.reports import output, values
from tests.helpers import REPO

REPORTS = REPO / "reports"
RENDERERS = sorted(p for p in REPORTS.glob("*.py") if p.name not in ("output.py", "values.py", "__init__.py"))


def _reports_imports(path):
    """The reports/ modules a file imports (any form: `from trainprobe.reports import x`,
    `from trainprobe.reports.x import y`, `import trainprobe.reports.x`)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            mod = node.module.removeprefix("trainprobe.")
            if mod == "reports":
                out |= {a.name for a in node.names}
            elif mod.startswith("reports."):
                out.add(mod.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.removeprefix("trainprobe.").split(".")[1] for a in node.names
                    if a.name.removeprefix("trainprobe.").startswith("reports.")}
    return out


@pytest.mark.parametrize("path", RENDERERS, ids=lambda p: p.name)
def test_no_renderer_imports_the_forms_module(path):
    assert "output" not in _reports_imports(path), f"{path.name} imports reports/output.py: import reports/values.py"


def test_values_is_the_bottom_of_reports():
    assert _reports_imports(REPORTS / "values.py") == set()


def test_the_import_check_sees_each_form(tmp_path):
    src = tmp_path / "r.py"
    src.write_text("from trainprobe.reports import output\nfrom trainprobe.reports.output import x\n"
                   "import trainprobe.reports.output\ndef f():\n    from trainprobe.reports.values import y\n")
    assert _reports_imports(src) == {"output", "values"}


def test_the_worth_acting_limit_is_the_headlines():
    from trainprobe.agent import ranking
    from trainprobe.agent.rules import compute_bound
    assert values.WORTH_ACTING_X == ranking.SMALL_GAIN == compute_bound.WORTH_ACTING


def test_fmt_value_writes_derived_figures_to_three_significant_digits():
    assert [values.fmt_value(v) for v in (1.41147, 15.1512, 1.22764, 999.7, 0.0042, 16.0, 0.88)] == \
        ["1.41", "15.2", "1.23", "1,000", "0.0042", "16", "0.88"]
    assert values.fmt_value({"proc_reads": 28, "nested": {"a": 1, "b": 2.5}}) == "proc_reads 28, nested (a 1, b 2.5)"


def test_short_reason_is_the_first_clause():
    long = ("perf not found on PATH: install perf (Debian: `apt-get install linux-perf`; Ubuntu: "
            "`apt-get install linux-tools-common linux-tools-$(uname -r)`; Fedora/RHEL: `dnf install perf`)")
    assert values.short_reason({"reason": long}) == "perf not found on PATH"
    assert values.short_reason({"reason": long, "short_reason": "no perf"}) == "no perf"
    assert values.short_reason({"reason": None}) is None
    assert len(values.short_reason({"reason": "x" * 400})) <= values.SHORT_REASON_CHARS


SURROGATE_PROFILE = {"$schema": "https://www.speedscope.app/file-format-schema.json",
                     "shared": {"frames": [{"name": "main", "file": "t.py", "line": 3},
                                           {"name": "bad\udc80name", "file": "t.py", "line": 9}]},
                     "profiles": [{"type": "sampled", "name": "p", "unit": "microseconds", "startValue": 0,
                                   "endValue": 10, "samples": [[0, 1]], "weights": [10]}], "name": "x"}


@pytest.mark.parametrize("fmt", ["folded", "svg"])
def test_a_lone_surrogate_is_written_as_a_visible_escape(tmp_path, fmt):
    """A name that was not UTF-8 (a lone surrogate, here from a speedscope file's JSON escape) is
    written by every form, to stdout and to a file, as `\\udc80`, never an internal error."""
    src = tmp_path / "p.json"
    src.write_text(json.dumps(SURROGATE_PROFILE))                  # ensure_ascii: the file holds "\udc80"
    cli = [sys.executable, "-m", "trainprobe.agent", "flamegraph", "--input", str(src), "--format", fmt]
    r = subprocess.run(cli, cwd=REPO, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    out = r.stdout.decode("utf-8")                                   # strict: valid UTF-8
    assert "\\udc80" in out or (fmt == "speedscope" and "\\\\udc80" in out)
    dest = tmp_path / f"o.{fmt}"
    r = subprocess.run(cli + ["-o", str(dest)], cwd=REPO, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert "udc80" in dest.read_bytes().decode("utf-8")


def test_text_report_with_a_lone_surrogate_in_the_command_line():
    report = json.loads((REPO / "tests/data/h200/live/starved.json").read_text())
    report["target"]["cmdline"] = "python train\udc80.py"
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="utf-8")               # strict, as sys.stdout is
    output.emit("report", "text", report, stream)
    stream.flush()
    assert "train\\udc80.py" in raw.getvalue().decode("utf-8")


def _small_gain_report():
    """The starved H200 report with its top finding worth 1.08x, and the headline the ranker writes."""
    from trainprobe.agent.ranking import headline
    rep = json.loads((REPO / "tests/data/h200/live/starved.json").read_text())
    f = rep["findings"][0]
    f["expected_speedup"], f["expected_speedup_interval"] = 1.08, [1.02, 1.12]
    rep["findings"] = [f]
    rep["headline"] = headline(rep["findings"])
    return rep


def test_a_finding_below_the_limit_reads_the_same_muted_verdict_in_text_and_html():
    rep = _small_gain_report()
    assert "even 1.1x" in rep["headline"]
    text, page = io.StringIO(), io.StringIO()
    output.emit("report", "text", rep, text)
    output.emit("report", "html", rep, page)
    from trainprobe.reports.text import render
    coloured = io.StringIO()
    render(rep, coloured, color=True)
    line = next(ln for ln in coloured.getvalue().splitlines() if ln.startswith("\x1b[2m#1"))
    assert "1.08x (1.02-1.12x): not worth acting on" in line and "\x1b[31m" not in line     # dim, never red
    assert "expected speedup 1.08x (1.02-1.12x): not worth acting on" in text.getvalue()
    html = page.getvalue()
    assert 'class="finding muted"' in html and 'data-worth-acting="no"' in html
    assert '<span class="speedup small">1.08x expected speedup (likely 1.02-1.12x): not worth acting on</span>' in html


def test_a_finding_above_the_limit_is_not_muted():
    rep = json.loads((REPO / "tests/data/h200/live/starved.json").read_text())
    page = io.StringIO()
    output.emit("report", "html", rep, page)
    assert 'data-worth-acting="yes"' in page.getvalue() and NOT_WORTH not in page.getvalue()


NOT_WORTH = values.NOT_WORTH_WORDS


def test_probes_line_gives_one_short_reason_and_json_keeps_the_long_one():
    rep = json.loads((REPO / "tests/data/h200/live/starved.json").read_text())
    long = ("perf not found on PATH: install perf (Debian: `apt-get install linux-perf`; Ubuntu: "
            "`apt-get install linux-tools-common linux-tools-$(uname -r)`; Fedora/RHEL: `dnf install perf`)")
    rep["probes"].append({"name": "perfstat", "status": "skipped", "reason": long, "seconds": 0})
    text, js = io.StringIO(), io.StringIO()
    output.emit("report", "text", rep, text)
    output.emit("report", "json", rep, js)
    probes = text.getvalue().split("probes: ", 1)[1].split("\noverhead", 1)[0]
    assert "perfstat skipped (perf not found on PATH)" in probes and "Debian" not in probes
    assert "full reasons: --json" in probes
    assert long in json.loads(js.getvalue())["probes"][-1]["reason"]


def test_html_footer_writes_probe_costs_as_values_not_json():
    rep = json.loads((REPO / "tests/data/h200/live/starved.json").read_text())
    rep.setdefault("overhead", {})["probes"] = {"placement": {"proc_reads": 28, "samples": 8}}
    page = io.StringIO()
    output.emit("report", "html", rep, page)
    assert "placement: proc_reads 28, samples 8" in page.getvalue()
    assert "{&quot;proc_reads" not in page.getvalue() and '{"proc_reads' not in page.getvalue()


def test_flamegraph_groups_frames_by_function_by_default_and_by_line_on_request():
    from tests.helpers import run_cli
    from trainprobe.reports import folded
    bundle = str(REPO / "tests/data/h200/live/bundles/starved.tar.gz")
    by_function = folded.parse(run_cli("flamegraph", "--input", bundle, "--format", "folded").out)
    by_line = folded.parse(run_cli("flamegraph", "--input", bundle, "--format", "folded", "--group", "line").out)
    assert by_line and sum(by_function.values()) == sum(by_line.values())
    frames_f = {f for k in by_function for f in k.split(";")}
    frames_l = {f for k in by_line for f in k.split(";")}
    assert not [f for f in frames_f if re.search(r":\d+\)$", f)]
    assert "_SingleProcessDataLoaderIter._next_data (torch/utils/data/dataloader.py:801)" in frames_l
    assert "_SingleProcessDataLoaderIter._next_data (torch/utils/data/dataloader.py)" in frames_f
    assert len(frames_f) < len(frames_l)
    assert folded.group(by_line, "function") == by_function


def test_a_grouped_frame_keeps_its_file_in_speedscope_and_its_colour():
    from trainprobe.reports import flamegraph, speedscope
    assert speedscope.frame_of("step (t.py)") == {"name": "step", "file": "t.py"}
    assert speedscope.label_of({"name": "step", "file": "t.py"}) == "step (t.py)"
    assert flamegraph.frame_kind("step (t.py)") == "user" and flamegraph.frame_kind("f (torch/x.py)") == "library"
    assert flamegraph.frame_kind("thread (12, loader)") == "pseudo"


def test_waiting_part_is_the_stacks_that_end_in_a_blocking_call():
    from trainprobe.agent.flame_split import waiting_part
    prof = {"a (t.py:1);Condition.wait (threading.py:3)": 5, "a (t.py:1);b (t.py:2)": 7, "a (t.py:1);Queue.get (q.py:9)": 2}
    assert waiting_part(prof) == {"a (t.py:1);Condition.wait (threading.py:3)": 5, "a (t.py:1);Queue.get (q.py:9)": 2}

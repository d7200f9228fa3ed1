"""reports/ reads top-down (forms -> renderers -> values), every view writes a value and a verdict the
same way, and every text form writes any string, a lone surrogate included."""
import ast
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

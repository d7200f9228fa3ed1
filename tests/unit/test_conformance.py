"""Every probe and rule declares its metadata, and the layers keep their direction of flow."""
import ast
import importlib
import inspect
from pathlib import Path

import pytest

from trainprobe.agent.findings import FINDING_IDS
from trainprobe.agent.rules import all_rules
from trainprobe.probes.base import Probe, ReadingProbe
from trainprobe.probes.registry import probe_classes
from trainprobe.probes.schema import is_typeddict
from tests.helpers import REPO

PROBES = probe_classes()


def test_probe_names_are_unique():
    names = [p.name for p in PROBES]
    assert len(names) == len(set(names)) and all(names)


@pytest.mark.parametrize("cls", PROBES, ids=lambda c: c.name)
def test_probe_declares_metadata(cls):
    assert cls.name and cls.name.replace("_", "").isalnum()
    assert cls.description and len(cls.description) < 120
    assert isinstance(cls.needs, tuple)
    assert cls.cost
    assert cls.timeout_s > 0
    assert cls.__doc__ is None or cls.__doc__.strip()
    module_doc = inspect.getmodule(cls).__doc__
    assert module_doc and module_doc.strip(), "each probe module says what it reads and what it costs"
    for meth in ("check", "capture", "parse"):
        assert getattr(cls, meth) is not getattr(Probe, meth), f"{cls.name} must implement {meth}"
    assert isinstance(inspect.getattr_static(cls, "parse"), staticmethod), "parse is a pure static function"
    assert is_typeddict(cls.evidence_schema), f"{cls.name} declares its evidence_schema (probes/schema.py)"


def test_every_module_at_the_top_of_probes_is_a_registered_probe():
    """probes/ holds probes: besides the framework (what a probe is, its errors, the list of probes,
    and the declared shapes of their evidence where a schema module holds them), each module there
    defines a Probe subclass listed in probes/registry.py; parsers and shared access live below."""
    registered = {(c.__module__, c.__name__) for c in PROBES}
    for path in sorted((REPO / "probes").glob("*.py")):
        if path.stem in ("base", "errors", "registry", "schema", "__init__"):
            continue
        mod = importlib.import_module(f"trainprobe.probes.{path.stem}")
        own = [c for c in vars(mod).values()
               if inspect.isclass(c) and issubclass(c, Probe) and c.__module__ == mod.__name__]
        assert own, f"probes/{path.name} defines no Probe: move it to probes/parsers or probes/support"
        for c in own:
            assert (c.__module__, c.__name__) in registered, f"{c.__name__} is not in probes/registry.py"


def test_preflight_probes_stay_out_of_diagnose():
    from trainprobe.agent.preflight.runner import POLICY, READS
    from trainprobe.agent.session import select_probes
    from trainprobe.probes import registry
    for table, command in ((registry.PROBES, "diagnose"), (registry.PREFLIGHT_PROBES, "preflight")):
        for name, mod, cls_name, default in table:  # a command imports only its own table's modules
            cls = getattr(importlib.import_module(mod), cls_name)
            assert command in cls.commands, name
            # The table says the name and whether it runs by default without importing the module.
            assert (cls.name, cls.default_enabled) == (name, default), cls_name
    pre = probe_classes("preflight")
    assert {c.name for c in pre} == {"host", "gpuhealth", "gpubench"}
    for cls in pre:
        assert issubclass(cls, ReadingProbe) and cls.reads and not cls.default_enabled
        assert "diagnose" not in cls.commands
        assert set(cls.evidence_schema.__annotations__) == set(cls.reads), "one ReadRecord per read"
    assert not {c.name for c in pre} & {c.name for c in probe_classes("diagnose")}
    # Not even --deep (all of diagnose's probes) runs them, so they never enter the budget plan.
    assert not {c.name for c in pre} & {p.name for p in select_probes(deep=True)}
    assert {p.name for p in select_probes(deep=True)} == {c.name for c in probe_classes("diagnose")}
    # Every read of a preflight probe has its tier and timeout, and the runner reads nothing else.
    assert set(POLICY) == set(READS) == {r for c in pre for r in c.reads}


def test_rules_declare_known_ids_and_probes():
    names = {p.name for p in PROBES}
    rules = all_rules()
    assert rules
    for r in rules:
        assert r.id in FINDING_IDS
        assert r.description
        for p in r.requires + r.uses:
            assert p in names, f"rule {r.name} names unknown probe {p!r}"


def test_rule_order_is_declared_and_followed():
    from trainprobe.agent.rules import _order, runs_after
    rules = all_rules()
    order = [r.name for r in _order(rules)]
    for r in rules:
        assert set(r.after) <= set(FINDING_IDS), f"rule {r.name} runs after unknown ids {r.after}"
        for other in rules:
            if runs_after(r, other):
                assert order.index(other.name) < order.index(r.name), f"{r.name} must run after {other.name}"
    cb = [r for r in rules if r.id == "compute.bound"]
    assert cb and all(set(r.after) >= set(FINDING_IDS) - {"compute.bound"} for r in cb), \
        "compute.bound reads every other finding: it declares every other id in `after`"
    assert order[-len(cb):] == [r.name for r in cb]


def _fake(name, fid, after=()):
    from trainprobe.agent.rules import Rule
    return Rule(fid, lambda ev: None, (), (), "test rule", name, tuple(after))


def test_rule_order_is_topological_and_keeps_declaration_order_otherwise():
    from trainprobe.agent.rules import _order
    a = _fake("m.a", "compute.bound", after=("host.sync",))
    b = _fake("m.b", "host.sync", after=("dataloader.starved",))
    c = _fake("m.c", "dataloader.starved")
    d = _fake("m.d", "dataloader.starved", after=("dataloader.starved",))     # after the other rule of its id
    e = _fake("m.e", "io.small_reads")
    assert [r.name for r in _order([a, b, d, c, e])] == ["m.c", "m.e", "m.d", "m.b", "m.a"]


def test_rule_order_rejects_cycles_and_unknown_ids():
    from trainprobe.agent.rules import _order, rule
    with pytest.raises(ValueError, match="cycle"):
        _order([_fake("m.a", "host.sync", after=("io.small_reads",)),
                _fake("m.b", "io.small_reads", after=("host.sync",))])
    with pytest.raises(ValueError, match="unknown"):
        _order([_fake("m.a", "host.sync", after=("no.such_id",))])
    with pytest.raises(ValueError, match="unknown"):
        rule("host.sync", after=("no.such_id",))


RULES_DIR = REPO / "agent" / "rules"
HELPERS = sorted(p for p in RULES_DIR.glob("_*.py") if p.name != "__init__.py")
RULE_FILES = sorted(p for p in RULES_DIR.glob("*.py") if not p.name.startswith("_"))


def _decorated_rules(tree: ast.Module) -> dict[str, ast.Call]:
    """Module-level functions decorated with @rule(...), with their decorator call."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "rule":
                    out[node.name] = d
    return out


def test_one_rule_module_per_finding_id():
    from trainprobe.agent.rules import RULE_MODULES
    ids = {fid.replace(".", "_"): fid for fid in FINDING_IDS}
    assert {p.stem for p in RULE_FILES} == set(ids), "one module named after each finding id, and no other"
    assert set(RULE_MODULES) == {f"trainprobe.agent.rules.{p.stem}" for p in RULE_FILES}
    for r in all_rules():
        module = r.fn.__module__.rsplit(".", 1)[-1]
        assert ids.get(module) == r.id, f"rule {r.name} returns {r.id}: it belongs in {r.id.replace('.', '_')}.py"
    for path in HELPERS:
        assert not _decorated_rules(ast.parse(path.read_text())), f"{path.name} is a helper: it holds no rule"


@pytest.mark.parametrize("path", RULE_FILES + HELPERS, ids=lambda p: p.name)
def test_rule_modules_never_import_each_other(path):
    rule_modules = {f"agent.rules.{p.stem}" for p in RULE_FILES}
    bad = (_imports(path) & rule_modules) - {f"agent.rules.{path.stem}"}
    assert not bad, f"{path.name} imports the rule module(s) {bad}: share a helper (agent/rules/_*.py) or a combiner"


def _reads_findings(node: ast.AST) -> bool:
    """Whether code reads earlier findings: `ev.context["findings"]` or `ev.context.get("findings")`."""
    for n in ast.walk(node):
        if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute) and n.value.attr == "context":
            if isinstance(n.slice, ast.Constant) and n.slice.value == "findings":
                return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" \
                and isinstance(n.func.value, ast.Attribute) and n.func.value.attr == "context" \
                and n.args and isinstance(n.args[0], ast.Constant) and n.args[0].value == "findings":
            return True
    return False


def _readers(tree: ast.Module) -> set[str]:
    """Module-level functions that read earlier findings, directly or through a function of the module."""
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    calls = {name: {c.func.id for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
             for name, fn in funcs.items()}
    readers = {name for name, fn in funcs.items() if _reads_findings(fn)}
    while True:
        more = {name for name in funcs if calls[name] & readers} - readers
        if not more:
            return readers
        readers |= more


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_a_rule_that_reads_findings_declares_after(path):
    """The order a rule needs is declared: reading ev.context['findings'] without `after` would
    silently depend on where the module sits in RULE_MODULES."""
    tree = ast.parse(path.read_text())
    for name in _readers(tree) & set(_decorated_rules(tree)):
        after = [k for k in _decorated_rules(tree)[name].keywords if k.arg == "after"]
        assert after, f"{path.name}: rule {name} reads earlier findings but declares no `after`"
    declared = {r.fn.__name__: r for r in all_rules() if r.fn.__module__.endswith("." + path.stem)}
    for name in _readers(tree) & set(declared):
        assert declared[name].after, f"{path.name}: rule {name} reads earlier findings with an empty `after`"


@pytest.mark.parametrize("path", HELPERS + sorted((REPO / "agent" / "combiners").glob("*.py"))
                         + sorted((REPO / "agent" / "analysis").glob("*.py")), ids=lambda p: p.name)
def test_helpers_and_combiners_never_read_findings(path):
    assert not _reads_findings(ast.parse(path.read_text())), \
        f"{path.name} reads earlier findings: only a rule may, and it declares them in `after`"


def test_every_rule_is_in_the_design_table():
    table = (REPO / "docs" / "design.md").read_text()
    for r in all_rules():
        assert f"| `{r.id}` | `{r.name}` |" in table, f"docs/design.md lists no row for {r.name}"


def test_every_finding_id_is_documented_in_the_readme():
    readme = (REPO / "README.md").read_text()
    for fid in FINDING_IDS:
        assert f"`{fid}`" in readme


def _local(module: str) -> str:
    """trainprobe.probes.parsers.procfs -> probes.parsers.procfs: the project's folders, whatever they
    install as."""
    return module[len("trainprobe."):] if module.startswith("trainprobe.") else module


def _imports(path: Path) -> set[str]:
    """The modules a file imports, the project's own named by their folder (probes.parsers.procfs)."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {_local(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(_local(node.module))
    return out


@pytest.mark.parametrize("path", sorted((REPO / "probes").rglob("*.py")), ids=lambda p: str(p.relative_to(REPO)))
def test_probes_never_import_agent_or_reports(path):
    bad = {m for m in _imports(path) if m.split(".")[0] in ("agent", "reports")}
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("path", sorted((REPO / "agent" / "rules").glob("*.py")), ids=lambda p: p.name)
def test_rules_never_touch_the_host(path):
    mods = _imports(path)
    assert not ({"subprocess", "os", "shutil", "socket", "psutil", "ctypes"} & {m.split(".")[0] for m in mods})
    pure = {"probes", "probes.parsers", "probes.parsers.pystacks", "probes.parsers.procfs", "probes.parsers.hw"}
    # shared pure parsers and facts only
    assert not any(m.startswith("probes") and m not in pure for m in mods), "rules read Evidence, not probes"
    tree_ = ast.parse(path.read_text())
    for node in ast.walk(tree_):
        if isinstance(node, ast.ImportFrom) and node.module and _local(node.module) in ("probes", "probes.parsers"):
            assert all(a.name in ("procfs", "pystacks", "hw") for a in node.names), "only pure parsers"
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "procfs":
            assert node.attr.startswith(("parse_", "format_")), f"{path.name} uses procfs.{node.attr}"
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id != "open", f"{path.name} opens a file"


@pytest.mark.parametrize("path", sorted((REPO / "reports").glob("*.py")), ids=lambda p: p.name)
def test_renderers_read_only_the_report(path):
    bad = {m for m in _imports(path) if m.split(".")[0] in ("probes",) or m.startswith("agent.rules")}
    assert not bad, f"{path.name} imports {bad}"


def test_tests_and_benchmarks_never_import_each_other():
    """Shared harness lives in scripts/; tests may run a benchmark as a command, never import one."""
    for folder, other in (("tests", "benchmarks"), ("benchmarks", "tests")):
        for path in (REPO / folder).rglob("*.py"):
            mods = _imports(path)
            assert not any(m.split(".")[0] == other for m in mods), f"{path.relative_to(REPO)} imports {other}"
            text = path.read_text()
            assert f'/ "{other}"))' not in text and f"sys.path.insert(0, str(REPO / \"{other}\"" not in text, path


# Calls that put bytes on disk other than through reports/output.py (mkstemp, fsync, rename: whole
# files, private modes, /dev/null and pipes handled). (file, call) -> why it may stay.
WRITERS_ALLOWED = {
    ("agent/bundle.py", "tarfile.open"): "builds the .tar.gz in memory (fileobj=BytesIO); output.write puts it on disk",
}
_WRITE_CALLS = {"write_text", "write_bytes", "write_to_textfile", "mkstemp", "NamedTemporaryFile", "replace",
                "rename", "copy", "copy2", "copyfile", "move"}
_WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}


def _call_name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        base = _call_name(func.value)
        return f"{base}.{func.attr}" if base else func.attr
    return ""


def _opens_for_writing(call: ast.Call) -> bool:
    """open()/tarfile.open()/os.fdopen() with a mode that writes, or one that cannot be read here."""
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    if mode is None:
        return False
    if not (isinstance(mode, ast.Constant) and isinstance(mode.value, str)):
        return True
    return bool(set(mode.value) & set("wax+"))


def _writes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        name = _call_name(node.func)
        last = name.rsplit(".", 1)[-1]
        if name == "os.open":
            flags = {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)} if len(node.args) > 1 else set()
            if flags & _WRITE_FLAGS:
                found.append(name)
        elif last in ("open", "fdopen") and _opens_for_writing(node):
            found.append(name)
        elif last in _WRITE_CALLS and (last not in ("replace", "rename", "copy", "move") or name.startswith(("os.", "shutil."))):
            found.append(name)
    return found


@pytest.mark.parametrize("path", sorted(p for folder in ("agent", "reports") for p in (REPO / folder).rglob("*.py")),
                         ids=lambda p: str(p.relative_to(REPO)))
def test_files_are_written_only_through_reports_output(path):
    rel = str(path.relative_to(REPO))
    if rel == "reports/output.py":
        return
    bad = [name for name in _writes(path) if (rel, name) not in WRITERS_ALLOWED]
    assert not bad, f"{rel} writes a file with {bad}: use reports.output (write, save, make_dir)"


def test_the_write_check_sees_each_way_of_writing(tmp_path):
    src = tmp_path / "w.py"
    src.write_text("import os, shutil, tarfile, tempfile\nopen(p, 'w')\nopen(p, mode='ab')\nopen(p)\n"
                   "os.open(p, os.O_WRONLY | os.O_CREAT)\nos.open(p, os.O_RDONLY)\nPath(p).write_text('x')\n"
                   "tarfile.open(p, 'w:gz')\ntempfile.mkstemp()\nos.replace(a, b)\nshutil.copy(a, b)\ns.replace('a', 'b')\n")
    assert sorted(_writes(src)) == sorted(["open", "open", "os.open", "write_text", "tarfile.open",
                                           "tempfile.mkstemp", "os.replace", "shutil.copy"])
    for (rel, name), why in WRITERS_ALLOWED.items():
        assert name in _writes(REPO / rel) and why, f"{rel}: {name} is allowed but no longer there"


@pytest.mark.parametrize("path", sorted((REPO / "agent" / "commands").glob("*.py")), ids=lambda p: p.name)
def test_commands_pick_outputs_through_reports_output(path):
    """A command names a form (reports.output.emit/save); it never imports a renderer to choose one.
    watch also serves its metrics over HTTP from watch_metrics' registry (a live endpoint, no file)."""
    allowed = {"reports.output"} | ({"reports.watch_metrics"} if path.name == "watch.py" else set())
    mods = _imports(path)
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and _local(node.module) == "reports":
            mods |= {f"reports.{a.name}" for a in node.names}
    bad = {m for m in mods if m.startswith("reports.") and m not in allowed}
    assert not bad, f"{path.name} imports {bad}"

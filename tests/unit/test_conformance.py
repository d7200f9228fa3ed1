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
    from trainprobe.agent.rules import _order
    rules = all_rules()
    order = [r.name for r in _order(rules)]
    for r in rules:
        assert set(r.after) <= set(FINDING_IDS), f"rule {r.name} runs after unknown ids {r.after}"
        for other in rules:
            if other.id in r.after and other.id != r.id:
                assert order.index(other.name) < order.index(r.name), f"{r.name} must run after {other.name}"
    cb = [r for r in rules if r.id == "compute.bound"]
    assert cb and all(r.after for r in cb), "compute.bound reads the other findings: it declares `after`"


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

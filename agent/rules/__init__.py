"""The rules engine. A rule is a small function of Evidence that returns a Finding or None.

A rule declares the evidence it requires (it is skipped, with the reason, when one is missing) and
the evidence it may use. Rules never run a command or read a file. A new rule is a function with
the @rule decorator in a module listed in RULE_MODULES.
"""
from __future__ import annotations

import importlib
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional

from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import FINDING_IDS, Finding

RuleFn = Callable[[Evidence], Optional[Finding]]

RULE_MODULES = (
    "trainprobe.agent.rules.dataloader",
    "trainprobe.agent.rules.memory",
    "trainprobe.agent.rules.numa",
    "trainprobe.agent.rules.pcie",
    "trainprobe.agent.rules.cpu",
    "trainprobe.agent.rules.io",
    "trainprobe.agent.rules.gil_contention",
    "trainprobe.agent.rules.compute_bound",
    "trainprobe.agent.rules.gpu",
)


@dataclass(frozen=True)
class Rule:
    id: str                      # the finding id it may return
    fn: RuleFn
    requires: tuple[str, ...]
    uses: tuple[str, ...]
    description: str
    name: str
    after: tuple[str, ...] = ()  # finding ids whose rules must run first (it reads their findings)


_RULES: list[Rule] = []


def rule(finding_id: str, requires: tuple[str, ...] = (), uses: tuple[str, ...] = (),
         description: str = "", after: tuple[str, ...] = ()) -> Callable[[RuleFn], RuleFn]:
    if finding_id not in FINDING_IDS:
        raise ValueError(f"unknown finding id {finding_id!r}")

    def deco(fn: RuleFn) -> RuleFn:
        name = f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"
        if not any(r.name == name for r in _RULES):
            _RULES.append(Rule(finding_id, fn, tuple(requires), tuple(uses),
                               description or (fn.__doc__ or "").strip().splitlines()[0], name,
                               tuple(after)))
        return fn

    return deco


def all_rules() -> list[Rule]:
    for mod in RULE_MODULES:
        importlib.import_module(mod)
    return list(_RULES)


def _order(rules: list[Rule]) -> list[Rule]:
    """Rules in declaration order, each moved after the rules of the ids in its `after`."""
    left, done, out = list(rules), set(), []
    while left:
        ready = [r for r in left if not any(a in {x.id for x in left if x is not r and x.id != r.id}
                                            for a in r.after)]
        if not ready:
            raise ValueError("rules' `after` declarations form a cycle: " + ", ".join(r.name for r in left))
        for r in ready:
            out.append(r)
            done.add(r.name)
        left = [r for r in left if r.name not in done]
    return out


@dataclass
class RuleRun:
    rule: str
    finding_id: str
    status: str          # fired | quiet | skipped | error
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "finding": self.finding_id, "status": self.status, "reason": self.reason}


def run_rules(ev: Evidence, rules: list[Rule] | None = None) -> tuple[list[Finding], list[RuleRun]]:
    """Run every rule whose required evidence is present, each after the rules its `after` names
    (compute.bound declares every host-side id: it sees their findings through ev.context['findings'])."""
    rules = rules if rules is not None else all_rules()
    findings: list[Finding] = []
    runs: list[RuleRun] = []
    ordered = _order(rules)
    for r in ordered:
        missing = [p for p in r.requires if not ev.has(p)]
        if missing:
            runs.append(RuleRun(r.name, r.id, "skipped", "missing " + "; ".join(ev.why_missing(p) for p in missing)))
            continue
        ev.context["findings"] = list(findings)
        try:
            f = r.fn(ev)
        except Exception as exc:  # noqa: BLE001 - one broken rule never sinks the report
            last = traceback.extract_tb(exc.__traceback__)[-1]
            runs.append(RuleRun(r.name, r.id, "error", f"{type(exc).__name__}: {exc} "
                                                       f"({last.filename.rsplit('/', 1)[-1]}:{last.lineno})"))
            continue
        if f is None:
            runs.append(RuleRun(r.name, r.id, "quiet"))
        else:
            if f.id != r.id:
                runs.append(RuleRun(r.name, r.id, "error", f"returned {f.id}, declared {r.id}"))
                continue
            # One finding per id: a second rule for the same id merges its evidence and fixes in.
            same = next((x for x in findings if x.id == f.id), None)
            if same is None:
                findings.append(f)
            elif f.expected_speedup > same.expected_speedup:
                f.evidence = same.evidence + [e for e in f.evidence if e not in same.evidence]
                findings[findings.index(same)] = f
            else:
                same.evidence += [e for e in f.evidence if e not in same.evidence]
            runs.append(RuleRun(r.name, r.id, "fired"))
    ev.context.pop("findings", None)
    return findings, runs

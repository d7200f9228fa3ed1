"""The rules engine. A rule is a small function of Evidence that returns a Finding or None.

A rule declares the evidence it requires (it is skipped, with the reason, when one is missing) and
the evidence it may use. Rules never run a command or read a file. A new rule is a function with
the @rule decorator in the module named after its finding id (`dataloader.starved` ->
dataloader_starved.py), listed in RULE_MODULES; a module holds the rules of one id only.

A rule that reads earlier findings (ev.context["findings"]) names their ids in `after`; the engine
runs it after every rule of those ids, in an order sorted from these declarations alone. Naming its
own id puts a rule after the other rules of that id that do not name it (the GPU side of
dataloader.starved refines the py-spy side's finding). Helpers shared by rules that are not rules
live in agent/rules/_*.py; facts joined from several probes live in agent/combiners/.
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
    "trainprobe.agent.rules.dataloader_starved",
    "trainprobe.agent.rules.cpu_memory_bound",
    "trainprobe.agent.rules.numa_remote",
    "trainprobe.agent.rules.pcie_degraded",
    "trainprobe.agent.rules.cpu_oversubscribed",
    "trainprobe.agent.rules.cpu_contended",
    "trainprobe.agent.rules.io_small_reads",
    "trainprobe.agent.rules.gil_contention",
    "trainprobe.agent.rules.h2d_pageable",
    "trainprobe.agent.rules.host_sync",
    "trainprobe.agent.rules.host_launch_bound",
    "trainprobe.agent.rules.rank_straggler",
    "trainprobe.agent.rules.compute_bound",
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
    unknown = [a for a in after if a not in FINDING_IDS]
    if unknown:
        raise ValueError(f"rule for {finding_id!r} runs after unknown finding ids {unknown}")

    def deco(fn: RuleFn) -> RuleFn:
        name = f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"
        if not any(r.name == name for r in _RULES):
            _RULES.append(Rule(finding_id, fn, tuple(requires), tuple(uses),
                               description or (fn.__doc__ or "").strip().splitlines()[0], name,
                               tuple(after)))
        return fn

    return deco


def all_rules() -> list[Rule]:
    """Every registered rule in RULE_MODULES order (then definition order within a module), whatever
    order the modules were first imported in; rules of other modules (a test's, an example's) last."""
    for mod in RULE_MODULES:
        importlib.import_module(mod)
    rank = {m: i for i, m in enumerate(RULE_MODULES)}
    return sorted(_RULES, key=lambda r: rank.get(r.fn.__module__, len(rank)))


def runs_after(r: Rule, other: Rule) -> bool:
    """Whether `r` must run after `other`: it names `other`'s id in `after`, and, for a rule of its
    own id, `other` does not name that id too (rules that all wait for their own id keep their order)."""
    if other is r or other.id not in r.after:
        return False
    return other.id != r.id or other.id not in other.after


def _order(rules: list[Rule]) -> list[Rule]:
    """Rules sorted topologically by `after`, in declaration order within each rank. A cycle or an
    unknown id in `after` is an error, never a silent order."""
    for r in rules:
        unknown = [a for a in r.after if a not in FINDING_IDS]
        if unknown:
            raise ValueError(f"rule {r.name} runs after unknown finding ids {unknown}")
    left, out = list(rules), []
    while left:
        ready = [r for r in left if not any(runs_after(r, o) for o in left)]
        if not ready:
            raise ValueError("rules' `after` declarations form a cycle: " + ", ".join(r.name for r in left))
        out += ready
        left = [r for r in left if not any(r is x for x in ready)]
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
    """Run every rule whose required evidence is present, each after the rules its `after` names;
    a rule sees the findings made before it in ev.context['findings']."""
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

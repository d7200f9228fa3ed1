"""Job bundles: every node's bundle of one `diagnose --slurm-job --save`, in one directory.

    job.json                         schema, job id, window, the nodes asked, each node's status and
                                     reason, each target's ranks and its bundle's folder
    job-report.json                  the merged report of the live run
    nodes/<node>/<pid>/              a plain bundle (agent.bundle) of one training process tree

`trainprobe report JOBBUNDLE` re-diagnoses every node bundle offline (the same parsers and rules)
and merges them again; nodes that failed live stay failed, with their reason.
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from trainprobe.agent import __version__, bundle
from trainprobe.reports import output
from trainprobe.probes.base import Capture

SCHEMA = "trainprobe.job-bundle/1"
INDEX = "job.json"


def is_job_bundle(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, INDEX))


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))[:100] or "_"


def check_target(path: str) -> None:
    if bundle.is_archive(path):
        raise bundle.BundleError(f"cannot save a job bundle to {path}: a job bundle is a directory (drop .tar.gz)")
    bundle.check_target(path)


def _write_json(path: str, obj: Any) -> None:
    output.write(path, json.dumps(obj, indent=2, default=str))


def _make_dirs(top: str, rel: str) -> None:
    """Private directories from `top` down to top/rel, each through the project's output module."""
    cur = top
    for part in [top] + [c for c in rel.split(os.sep) if c]:
        cur = part if part == top else os.path.join(cur, part)
        output.make_dir(cur)


def save(path: str, job_report: dict[str, Any], payloads: list[dict[str, Any]]) -> str:
    check_target(path)
    try:
        _make_dirs(path, "nodes")
        nodes = []
        for p in payloads:
            entry = {k: p.get(k) for k in ("node", "hostname", "status", "reason", "exit_code", "slurm_state",
                                           "slurmd_alive", "slurmd_note", "job_processes")}
            entry["targets"] = []
            for t in p.get("targets", []):
                te = {"target": t.get("target"), "status": t.get("status"), "reason": t.get("reason"),
                      "exit_code": t.get("exit_code"), "bundle": None}
                b = t.get("bundle")
                if b:
                    rel = os.path.join("nodes", _safe(p["node"]), _safe((t.get("target") or {}).get("pid")))
                    _make_dirs(path, rel)
                    bundle.save(os.path.join(path, rel), [Capture.from_dict(c) for c in b["captures"]],
                                b["context"], t.get("report"))
                    te["bundle"] = rel
                entry["targets"].append(te)
            nodes.append(entry)
        _write_json(os.path.join(path, "job-report.json"), job_report)
        _write_json(os.path.join(path, INDEX), {
            "schema": SCHEMA, "tool": {"name": "trainprobe", "version": __version__},
            "saved_unix": round(time.time(), 3), "job": job_report.get("job"), "window": job_report.get("window"),
            "notes": job_report.get("notes", []), "nodes": nodes})
    except OSError as exc:
        raise bundle.BundleError(f"cannot save the job bundle to {path}: {exc.strerror or exc}") from None
    return path


def rediagnose(path: str) -> dict[str, Any]:
    """The job report again, from the bundle alone."""
    from trainprobe.agent import diagnosis
    from trainprobe.agent.fleet.merge import merge
    from trainprobe.agent.fleet.rows import rank_rows

    try:
        with open(os.path.join(path, INDEX)) as fh:
            index = json.load(fh)
    except (OSError, ValueError) as exc:
        raise bundle.BundleError(f"cannot read the job bundle {path}: {exc}") from None
    if index.get("schema") != SCHEMA:
        raise bundle.BundleError(f"{path}: unknown job bundle schema {index.get('schema')!r} (this trainprobe reads {SCHEMA})")
    payloads = []
    for n in index.get("nodes", []):
        p = {k: v for k, v in n.items() if k != "targets"}
        p["targets"] = []
        for t in n.get("targets", []):
            entry = {"target": t.get("target"), "status": t.get("status"), "reason": t.get("reason"),
                     "exit_code": t.get("exit_code")}
            if t.get("bundle"):
                full = os.path.normpath(os.path.join(path, t["bundle"]))
                if not full.startswith(os.path.normpath(path) + os.sep):
                    raise bundle.BundleError(f"{path}: node bundle {t['bundle']!r} points outside the job bundle")
                b = bundle.load(full)
                rep, ev = diagnosis.report_from(b.captures, b.context, b.overhead,
                                                b.context.get("session_notes") or [])
                entry["report"] = rep
                entry["rows"] = rank_rows(ev, rep, (t.get("target") or {}).get("ranks") or [], n["node"])
            p["targets"].append(entry)
        payloads.append(p)
    job = index.get("job") or {}
    rep = merge(job.get("id", "?"), payloads, (index.get("window") or {}).get("seconds"), nodes=job.get("nodes"),
                notes=[x for x in index.get("notes", []) if x.startswith("srun")])
    rep["command"] = "report"
    rep["source"] = {"job_bundle": path, "saved_unix": index.get("saved_unix"),
                     "saved_by_version": (index.get("tool") or {}).get("version")}
    return rep

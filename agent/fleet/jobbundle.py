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
from trainprobe.probes.parsers import safejson

SCHEMA = "trainprobe.job-bundle/1"
INDEX = "job.json"


def is_job_bundle(path: str) -> bool:
    return os.path.isdir(path) and os.path.lexists(os.path.join(path, INDEX))    # a planted link is refused, not missed


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


_NODE_KEYS = ("node", "hostname", "status", "reason", "exit_code", "slurm_state", "slurmd_alive", "slurmd_note",
              "job_processes")
_TARGET_KEYS = ("status", "reason", "exit_code")
_REL = re.compile(r"^nodes/[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$")


def _scalar(v: Any) -> Any:
    """A value of job.json that merge prints: kept if a plain scalar, else its text (a job bundle
    comes from someone else: a list where a status belongs is not followed anywhere)."""
    return v if v is None or isinstance(v, (str, int, float, bool)) else str(v)[:200]


def _target(t: Any) -> dict[str, Any]:
    t = t if isinstance(t, dict) else {}
    target = t.get("target") if isinstance(t.get("target"), dict) else {}
    ranks = target.get("ranks") if isinstance(target.get("ranks"), list) else []
    return {"target": {**{k: _scalar(v) for k, v in target.items() if k != "ranks"},
                       "ranks": [{k: _scalar(v) for k, v in r.items()} for r in ranks
                                 if isinstance(r, dict) and isinstance(r.get("pid"), int)]},
            **{k: _scalar(t.get(k)) for k in _TARGET_KEYS}, "bundle": t.get("bundle")}


def read_index(path: str, root_fd: int) -> dict[str, Any]:
    """job.json: a regular file of the job bundle (never a link, a FIFO or a device), bounded JSON."""
    raw = bundle.read_file_at(root_fd, INDEX, path, bundle.MAX_MEMBER_BYTES)
    if raw is None:
        raise bundle.BundleError(f"{path}: no {INDEX}")
    try:
        index = safejson.loads(raw, f"{path}: {INDEX}", bundle.MAX_MEMBER_BYTES)
    except safejson.JSONLimitError as exc:
        raise bundle.BundleError(f"cannot read the job bundle {path}: {exc}") from None
    if not isinstance(index, dict) or index.get("schema") != SCHEMA:
        got = index.get("schema") if isinstance(index, dict) else None
        raise bundle.BundleError(f"{path}: unknown job bundle schema {got!r} (this trainprobe reads {SCHEMA})")
    nodes = index.get("nodes", [])
    if not isinstance(nodes, list) or not all(isinstance(n, dict) and isinstance(n.get("targets", []), list)
                                             for n in nodes) or len(nodes) > 4096:
        raise bundle.BundleError(f"{path}: {INDEX} is malformed (nodes must be a list of objects with targets)")
    return index


def rediagnose(path: str) -> dict[str, Any]:
    """The job report again, from the bundle alone. A node bundle that cannot be read (a link, a
    FIFO, a bad member, over a cap) fails that target with its one line; the other nodes stand."""
    from trainprobe.agent import diagnosis
    from trainprobe.agent.fleet.merge import merge
    from trainprobe.agent.fleet.rows import rank_rows

    root_fd = bundle.open_dir(path)
    try:
        index = read_index(path, root_fd)
        payloads, skipped = [], []
        for n in index.get("nodes", []):
            p = {k: _scalar(n.get(k)) for k in _NODE_KEYS}
            p["node"] = str(p["node"]) if p["node"] is not None else "?"
            p["targets"] = []
            for raw in n.get("targets", []):
                t = _target(raw)
                entry = {k: t[k] for k in ("target", *_TARGET_KEYS)}
                rel = t["bundle"]
                if rel:
                    try:
                        if not isinstance(rel, str) or not _REL.match(rel):
                            raise bundle.BundleError(f"{path}: node bundle {str(rel)[:100]!r} is not "
                                                     f"nodes/<node>/<pid> inside the job bundle")
                        fd = bundle.open_dir(path, rel)
                        try:
                            b = bundle.load_at(fd, os.path.join(path, rel))
                        finally:
                            os.close(fd)
                        if not isinstance(b.context.get("window"), dict):
                            raise bundle.BundleError(f"{os.path.join(path, rel)}: no diagnosis window in its context")
                        try:
                            rep, ev = diagnosis.report_from(b.captures, b.context, b.overhead,
                                                            b.context.get("session_notes") or [])
                        except (TypeError, ValueError, KeyError, AttributeError) as exc:
                            raise bundle.BundleError(f"{os.path.join(path, rel)}: its context is malformed "
                                                     f"({type(exc).__name__}: {exc})") from None
                    except bundle.BundleError as exc:
                        entry.update(status="failed", reason=f"its bundle was not read: {exc}", exit_code=2)
                        skipped.append(f"node {p['node']}: bundle skipped: {exc}")
                    else:
                        entry["report"] = rep
                        entry["rows"] = rank_rows(ev, rep, t["target"]["ranks"], p["node"])
                p["targets"].append(entry)
            payloads.append(p)
    finally:
        os.close(root_fd)
    job = index.get("job") if isinstance(index.get("job"), dict) else {}
    window = index.get("window") if isinstance(index.get("window"), dict) else {}
    notes = index.get("notes") if isinstance(index.get("notes"), list) else []
    job_nodes = job.get("nodes") if isinstance(job.get("nodes"), list) else None
    seconds = window.get("seconds")
    rep = merge(str(_scalar(job.get("id", "?"))), payloads,
                seconds if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else None,
                nodes=[str(_scalar(x)) for x in job_nodes] if job_nodes is not None else None,
                notes=[x for x in notes if isinstance(x, str) and x.startswith("srun")] + skipped)
    rep["command"] = "report"
    tool = index.get("tool") if isinstance(index.get("tool"), dict) else {}
    rep["source"] = {"job_bundle": path, "saved_unix": _scalar(index.get("saved_unix")),
                     "saved_by_version": _scalar(tool.get("version"))}
    return rep

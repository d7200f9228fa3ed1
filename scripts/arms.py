"""Arms of benchmarks/public_knobs.py: knob sets parsed from the command line, and the step model's
prediction for each on a diagnosed window (shared with the tests, which never import a benchmark)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def parse_arms(spec: str) -> list[tuple[str, dict[str, Any]]]:
    """'name:key=value,key=value;name2:...' -> [(name, knobs)]; values are JSON where they parse
    (1, true, 0.5), else strings."""
    arms = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, _, body = part.partition(":")
        if not name or not body:
            raise ValueError(f"an arm is NAME:KEY=VALUE[,KEY=VALUE]: {part!r}")
        knobs: dict[str, Any] = {}
        for kv in body.split(","):
            k, _, v = kv.partition("=")
            try:
                knobs[k.strip()] = json.loads(v)
            except json.JSONDecodeError:
                knobs[k.strip()] = v.strip()
        arms.append((name.strip(), knobs))
    return arms


def predicted(bundle: Path, knobs: dict[str, Any]) -> dict[str, Any]:
    """The step model's speedup for these knobs on the diagnosed window (None where it has no model)."""
    from trainprobe.agent import bundle as bundle_mod
    from trainprobe.agent.combiners import step_model
    from trainprobe.agent.diagnosis import evidence_from
    from trainprobe.agent.report import change_of
    b = bundle_mod.load(str(bundle))
    m = step_model.from_evidence(evidence_from(b.captures, b.context))
    if m is None:
        return {"speedup": None, "why": "no step model for this window"}
    ch = change_of("dataloader.starved", knobs)     # the DataLoader, thread and hand-off knobs
    st = m.after(ch)
    if st is None:
        return {"speedup": None, "why": "the model does not cover this change"}
    return {"speedup": round(st.speedup, 3), "interval": [round(x, 3) for x in st.interval],
            "binding": st.binding, "terms": {k: round(v, 4) for k, v in st.terms.items()}}

"""A pure parser of `perf stat -x SEP` output, and the counters derived from it.

perf calls its CSV mode "not-quite-CSV": fields are never quoted, so a raw event such as
`cpu/event=0x3c,umask=0x0/` breaks a comma split (trainprobe runs perf with `-x ';'`). What a
line can hold, in order (perf-stat.txt "CSV FORMAT" and stat-display.c, checked against perf 6.1):

    [timestamp SEP] [aggregation id SEP [aggregated cpus SEP]] value SEP unit SEP event SEP
    [cgroup SEP] [variance% SEP] runtime_ns SEP pct_running [SEP metric_value SEP metric_unit]

- the interval timestamp is left-padded with spaces (`     0.200509175`), and so is `summary`;
- value is `<not supported>` (the event cannot be counted here: no PMU, unknown event) or
  `<not counted>` (supported, but it never ran in this interval: thread asleep, or multiplexed
  out); those rows print runtime 0 and percentage 100.00, so 100% does not mean "valid";
- with `-r N` a `NN.NN%` variance field comes *before* the runtime (the man page says after);
- the percentage is the share of the time the counter was on the PMU (run/enabled): below 100
  when counters were multiplexed, and perf has already scaled the value up by enabled/run;
- event names carry modifiers (`cycles:u` when perf fell back to user-only counting) or a PMU
  (`cpu_core/cycles/` on hybrid CPUs);
- aggregation ids: `CPU7` (-A), `S0` `S0-D0-C3` `N0` with a cpu count (--per-socket/core/node),
  `comm-tid` (--per-thread), `summary` (--summary);
- metric-only lines (`,,,,,1.37,stalled cycles per insn`, `,2258...,100.00,,,,TopdownL1`) carry no
  counter and are skipped; `# started on ...` headers, blank lines and perf's own messages (when
  the output went to stderr) are kept aside as unparsed lines.

Nothing here touches the host: `parse_text` takes text, `summarise` takes parsed rows.
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from trainprobe.probes.errors import parser

NOT_SUPPORTED = "not supported"
NOT_COUNTED = "not counted"
COUNTED = "counted"

HARDWARE_EVENTS = ("instructions", "cycles", "LLC-loads", "LLC-load-misses", "cache-references", "cache-misses")
SOFTWARE_EVENTS = ("task-clock", "context-switches", "cpu-migrations", "page-faults", "major-faults")
# Software events that happen in the kernel: with a user-only (`:u`) fallback they read zero.
KERNEL_SIDE_EVENTS = ("context-switches", "cpu-migrations", "page-faults", "major-faults", "minor-faults")
# perf's aliases for the same counters.
ALIASES = {"cpu-cycles": "cycles", "cs": "context-switches", "migrations": "cpu-migrations",
           "faults": "page-faults"}

_NUM = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_UNIT = re.compile(r"^[A-Za-z%/]*$")
_VARIANCE = re.compile(r"^[+-]?\d+(\.\d+)?%$")
_PMU_EVENT = re.compile(r"^([A-Za-z0-9_.-]+)/([^/]+)/([A-Za-z]*)$")
_TID_SUFFIX = re.compile(r"^(.*)-(\d+)$")
_CPU_ID = re.compile(r"^CPU(\d+)$")
_TOPO_ID = re.compile(r"^(S\d+|S\d+-D\d+|S\d+-D\d+-C\d+|S\d+-C\d+|N\d+|S\d+-D\d+-L\d+-ID\d+)$")


@dataclass
class Row:
    """One counter reading: one event, for one aggregation (thread, CPU, socket...), one interval."""

    event: str                 # as perf printed it: "cycles:u", "cpu_core/instructions/"
    name: str                  # the counter: "cycles" (modifiers and PMU stripped, aliases resolved)
    status: str                # counted | not counted | not supported
    value: float | None        # scaled by perf when multiplexed; None unless counted
    unit: str = ""
    timestamp: float | None = None
    aggregation: str | None = None     # "CPU7", "S0", "python-1234", "summary"
    aggregated_cpus: int | None = None
    comm: str | None = None            # --per-thread: the thread's name
    tid: int | None = None             # --per-thread: the thread id
    modifiers: str = ""                # "u", "k", "ppp"
    pmu: str | None = None             # "cpu_core" for cpu_core/cycles/
    cgroup: str | None = None
    variance_pct: float | None = None  # -r N
    runtime_ns: float | None = None
    pct_running: float | None = None
    metric_value: float | None = None
    metric_unit: str | None = None

    @property
    def enabled_ns(self) -> float | None:
        """Time the counter was enabled (run / share running), when perf says how long it ran."""
        if self.runtime_ns is None or not self.pct_running:
            return None
        return self.runtime_ns * 100.0 / self.pct_running

    @property
    def multiplexed(self) -> bool:
        return self.status == COUNTED and self.pct_running is not None and self.pct_running < 99.995


@dataclass
class ParsedStat:
    sep: str
    rows: list[Row] = field(default_factory=list)
    started_on: str | None = None
    unparsed: list[str] = field(default_factory=list)

    @property
    def interval_mode(self) -> bool:
        return any(r.timestamp is not None for r in self.rows)

    @property
    def timestamps(self) -> list[float]:
        return sorted({r.timestamp for r in self.rows if r.timestamp is not None})


def _is_num(s: str) -> bool:
    return bool(_NUM.match(s))


def _is_value(s: str) -> bool:
    return _is_num(s) or s in ("<not supported>", "<not counted>")


def split_event(event: str) -> tuple[str, str, str | None]:
    """'cycles:u' -> ('cycles', 'u', None); 'cpu_core/cycles/' -> ('cycles', '', 'cpu_core')."""
    pmu = None
    m = _PMU_EVENT.match(event)
    base, mods = event, ""
    if m:
        pmu, base, mods = m.group(1), m.group(2), m.group(3)
        if "=" in base:          # a raw cpu/event=0x3c,umask=0x0/ keeps its full spelling
            return event, mods, pmu
    elif ":" in event:
        base, mods = event.rsplit(":", 1)
    base = ALIASES.get(base, base)
    return base, mods, pmu


def _value_index(f: list[str]) -> int | None:
    """Where the counter value sits: a value, then a unit-like field, then an event name."""
    for i in range(len(f) - 2):
        if _is_value(f[i]) and _UNIT.match(f[i + 1]) and f[i + 2] and not _is_num(f[i + 2]) \
                and not f[i + 2].startswith("<"):
            return i
    return None


@parser("perf stat output parse_line")
def parse_line(line: str, sep: str) -> Row | None:
    """One line of perf stat -x output -> a Row, or None when it holds no counter."""
    if not line.strip() or line.lstrip().startswith("#"):
        return None
    f = [x.strip() for x in line.rstrip("\n").split(sep)]
    i = _value_index(f)
    if i is None:
        return None
    prefix = f[:i]
    ts = None
    if prefix and _is_num(prefix[0]) and "." in prefix[0]:
        ts = float(prefix[0])
        prefix = prefix[1:]
    raw, unit, event = f[i], f[i + 1], f[i + 2]
    name, mods, pmu = split_event(event)
    status = COUNTED
    value: float | None = None
    if raw == "<not supported>":
        status = NOT_SUPPORTED
    elif raw == "<not counted>":
        status = NOT_COUNTED
    else:
        value = float(raw)
    row = Row(event=event, name=name, status=status, value=value, unit=unit, timestamp=ts,
              modifiers=mods, pmu=pmu)
    if prefix:
        agg = prefix[0]
        row.aggregation = agg or None
        if len(prefix) > 1 and prefix[1].isdigit():
            row.aggregated_cpus = int(prefix[1])
        if agg and agg != "summary" and not _CPU_ID.match(agg) and not _TOPO_ID.match(agg):
            m = _TID_SUFFIX.match(agg)
            if m:
                row.comm, row.tid = m.group(1), int(m.group(2))
    rest = f[i + 3:]
    # Between the event and the runtime: an optional cgroup name, an optional -r variance.
    nums: list[str] = []
    k = 0
    while k < len(rest) and len(nums) < 2:
        x = rest[k]
        if _VARIANCE.match(x) and not nums:
            row.variance_pct = float(x[:-1])
        elif _is_num(x):
            nums.append(x)
        elif x and not nums and row.cgroup is None:
            row.cgroup = x
        elif not x and not nums:
            pass
        else:
            break
        k += 1
    if nums:
        row.runtime_ns = float(nums[0])
    if len(nums) > 1:
        row.pct_running = float(nums[1])
    tail = rest[k:]
    if tail and _is_num(tail[0]):
        row.metric_value = float(tail[0])
        row.metric_unit = tail[1] if len(tail) > 1 and tail[1] else None
    return row


def detect_separator(text: str) -> str:
    """The separator that turns the most lines into counters (perf's default -x is ',')."""
    best, best_n = ",", -1
    for sep in (";", ",", "\t", "|", ":"):
        n = sum(1 for ln in text.splitlines() if sep in ln and parse_line(ln, sep) is not None)
        if n > best_n:
            best, best_n = sep, n
    return best


@parser("perf stat output parse_text")
def parse_text(text: str, sep: str | None = None) -> ParsedStat:
    """All the counter rows of one perf stat -x output (file written with -o, or its stderr)."""
    sep = sep or detect_separator(text)
    out = ParsedStat(sep=sep)
    for ln in text.splitlines():
        s = ln.strip()
        if not s:
            continue
        if s.startswith("#"):
            if s.startswith("# started on") and out.started_on is None:
                out.started_on = s[len("# started on"):].strip()
            continue
        row = parse_line(ln, sep)
        if row is None:
            if not _metric_only(s, sep):
                out.unparsed.append(s)
            continue
        out.rows.append(row)
    return out


def _metric_only(s: str, sep: str) -> bool:
    """A line perf prints for a derived metric alone: no counter value, event field empty."""
    f = [x.strip() for x in s.split(sep)]
    return len(f) >= 4 and (f[0] == "" or _is_num(f[0]) or _TOPO_ID.match(f[0]) is not None
                            or f[0] == "summary") and any(x == "" for x in f[1:4])


# -- derived counters -----------------------------------------------------------------------------

@dataclass
class Counter:
    """One event summed over the rows of a thread, a process, a group or an interval."""

    value: float = 0.0
    runtime_ns: float = 0.0
    enabled_ns: float = 0.0
    counted_rows: int = 0
    not_counted_rows: int = 0
    not_supported_rows: int = 0
    user_only: bool = False

    def add(self, r: Row) -> None:
        if "u" in r.modifiers and "k" not in r.modifiers:
            self.user_only = True
        if r.status == NOT_SUPPORTED:
            self.not_supported_rows += 1
            return
        if r.status == NOT_COUNTED:
            self.not_counted_rows += 1
            return
        self.counted_rows += 1
        self.value += r.value or 0.0
        if r.runtime_ns is not None:
            self.runtime_ns += r.runtime_ns
            en = r.enabled_ns
            self.enabled_ns += en if en is not None else r.runtime_ns

    @property
    def status(self) -> str:
        if self.counted_rows:
            return COUNTED
        if self.not_supported_rows and not self.not_counted_rows:
            return NOT_SUPPORTED
        return NOT_COUNTED

    @property
    def running_share(self) -> float | None:
        """Share of the enabled time the counter was on the PMU (1.0: never multiplexed)."""
        if not self.counted_rows:
            return None
        if self.enabled_ns <= 0:
            return 1.0
        return min(1.0, self.runtime_ns / self.enabled_ns)

    def to_dict(self) -> dict[str, Any]:
        return {"value": _round(self.value) if self.counted_rows else None, "status": self.status,
                "running_share": _round(self.running_share, 4), "user_only": self.user_only}


def _round(x: float | None, nd: int = 6) -> float | None:
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return None
    return round(x, nd)


def counters_of(rows: Iterable[Row]) -> dict[str, Counter]:
    """Sum rows by counter name (hybrid cpu_core/cpu_atom rows of one event add up)."""
    out: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        out[r.name].add(r)
    return dict(out)


def _seconds(c: Counter | None) -> float | None:
    if c is None or not c.counted_rows:
        return None
    return c.value / 1000.0      # task-clock / cpu-clock are printed in msec


def _ratio(num: Counter | None, den: Counter | None, scale: float = 1.0) -> tuple[float | None, float | None]:
    """num/den with its trust: the smaller running share of the two counters."""
    if num is None or den is None or not num.counted_rows or not den.counted_rows or den.value <= 0:
        return None, None
    trust = min(num.running_share or 0.0, den.running_share or 0.0)
    return num.value * scale / den.value, trust


def derive(cs: dict[str, Counter], seconds: float | None) -> dict[str, Any]:
    """IPC, LLC miss ratio, LLC misses per 1000 instructions and software rates from counters.

    The LLC ratio uses LLC-load-misses/LLC-loads; where those are not supported (many AMD cores
    do not map the generic LLC events) it falls back to cache-misses/cache-references, and says
    which it used. Each ratio carries `trust`: the smaller running share of the counters it
    divides (1.0 unless perf multiplexed them; perf already scaled both to the full time).
    """
    ipc, ipc_trust = _ratio(cs.get("instructions"), cs.get("cycles"))
    llc_source = "LLC-load-misses/LLC-loads"
    miss, miss_trust = _ratio(cs.get("LLC-load-misses"), cs.get("LLC-loads"))
    misses = cs.get("LLC-load-misses")
    if miss is None:
        miss, miss_trust = _ratio(cs.get("cache-misses"), cs.get("cache-references"))
        llc_source = "cache-misses/cache-references" if miss is not None else None
        misses = cs.get("cache-misses")
    mpki, mpki_trust = _ratio(misses, cs.get("instructions"), 1000.0)
    clock = cs.get("task-clock") if "task-clock" in cs else cs.get("cpu-clock")
    task_s = _seconds(clock)
    if task_s is None and clock is not None and clock.status == NOT_COUNTED:
        task_s = 0.0             # a thread that never ran in the window used no CPU
    out: dict[str, Any] = {
        "ipc": _round(ipc, 4), "ipc_trust": _round(ipc_trust, 4),
        "llc_miss_ratio": _round(miss, 4), "llc_miss_trust": _round(miss_trust, 4), "llc_source": llc_source,
        "llc_mpki": _round(mpki, 4), "llc_mpki_trust": _round(mpki_trust, 4),
        "task_clock_s": _round(task_s, 6),
        "cpu_cores": _round(task_s / seconds, 4) if (task_s is not None and seconds) else None,
    }
    for ev in ("instructions", "cycles", "LLC-loads", "LLC-load-misses", "cache-references", "cache-misses"):
        c = cs.get(ev)
        out[ev.lower().replace("-", "_")] = _round(c.value) if (c and c.counted_rows) else None
    user_only = any(c.user_only for c in cs.values())
    for ev in SOFTWARE_EVENTS[1:]:
        key = ev.replace("-", "_")
        c = cs.get(ev)
        if c is not None and c.status == NOT_COUNTED and not (user_only and ev in KERNEL_SIDE_EVENTS):
            # Supported but never running: the thread was not scheduled, so nothing happened.
            out[key], out[key + "_per_s"] = 0, (0.0 if seconds else None)
            continue
        if c is None or not c.counted_rows or (user_only and ev in KERNEL_SIDE_EVENTS):
            # A user-only (`:u`) count of a kernel-side event reads 0 whatever happened.
            out[key] = None
            out[key + "_per_s"] = None
            continue
        out[key] = int(round(c.value))
        out[key + "_per_s"] = _round(c.value / seconds, 3) if seconds else None
    out["user_only"] = user_only
    return out


def event_status(rows: Iterable[Row]) -> dict[str, str]:
    """Per counter name: counted if any row counted, else not counted / not supported."""
    return {name: c.status for name, c in counters_of(rows).items()}


def interval_series(rows: list[Row]) -> list[dict[str, Any]]:
    """Per interval (interval mode): IPC, LLC miss ratio, MPKI and cores used, with their trust."""
    by_ts: dict[float, list[Row]] = defaultdict(list)
    for r in rows:
        if r.timestamp is not None and r.aggregation != "summary":
            by_ts[r.timestamp].append(r)
    out = []
    prev = 0.0
    for ts in sorted(by_ts):
        d = derive(counters_of(by_ts[ts]), ts - prev)
        out.append({"t": round(ts, 6), "seconds": round(ts - prev, 6), "ipc": d["ipc"], "ipc_trust": d["ipc_trust"],
                    "llc_miss_ratio": d["llc_miss_ratio"], "llc_miss_trust": d["llc_miss_trust"],
                    "llc_mpki": d["llc_mpki"], "cpu_cores": d["cpu_cores"],
                    "context_switches_per_s": d["context_switches_per_s"]})
        prev = ts
    return out


def window_seconds(parsed: ParsedStat, fallback: float | None = None) -> float | None:
    """The span the counts cover: the last interval timestamp, else the caller's window."""
    ts = parsed.timestamps
    return ts[-1] if ts else fallback

"""The example outputs in README.md and docs/*.md, generated from the real command.

An example is a fenced block between two markers; the opening marker names the command:

    <!-- example: trainprobe report tests/data/h200/live/bundles/starved.tar.gz -->
    ```
    (what the command prints)
    ```
    <!-- /example -->

`python scripts/docs_examples.py --write` runs every marked command (no shell: `trainprobe ARGS`
with NO_COLOR, in the repository root, on files in the repository) and writes what it printed on
stdout into its block. Without --write it checks: each block must read what the command prints
now, or the script lists the stale ones and exits 1 (tests/unit/test_docs_examples.py runs this
check). Options after the command, separated by ` | `, cut the output: `head N` keeps the first N
lines, `from TEXT` starts at the first line holding TEXT, `until TEXT` stops before the next line
holding TEXT. Durations measured by the run itself (a preflight check's TIME column, "in 0.34 s")
are compared as any number, so only what the tool decides has to match.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = ("README.md", "docs/*.md")
BLOCK = re.compile(r"(?P<open><!-- example: (?P<spec>.+?) -->\n)```(?P<lang>[a-z]*)\n(?P<body>.*?)```\n"
                   r"(?P<close><!-- /example -->)", re.S)
# Figures that time the run itself, not the tool's verdict: compared as "some number".
TIMINGS = (re.compile(r"\b\d+(?:\.\d+)? ms$"), re.compile(r"\bin \d+\.\d+ s$"))
TIMEOUT_S = 120


@dataclass
class Example:
    page: Path
    spec: str
    body: str
    start: int
    end: int

    @property
    def where(self) -> str:
        line = self.page.read_text()[:self.start].count("\n") + 1
        return f"{self.page.relative_to(REPO)}:{line}"


class ExampleError(ValueError):
    pass


def pages() -> list[Path]:
    out: list[Path] = []
    for pattern in PAGES:
        out.extend(sorted(REPO.glob(pattern)))
    return out


def examples(page: Path) -> list[Example]:
    text = page.read_text()
    return [Example(page, m.group("spec").strip(), m.group("body"), m.start("body"), m.end("body"))
            for m in BLOCK.finditer(text)]


def _argv(spec: str) -> tuple[list[str], list[tuple[str, str]]]:
    cmd, *cuts = [part.strip() for part in spec.split(" | ")]
    argv = shlex.split(cmd)
    if not argv or argv[0] != "trainprobe":
        raise ExampleError(f"an example runs trainprobe, not {argv[:1]}: {spec!r}")
    ops = []
    for c in cuts:
        op, _, arg = c.partition(" ")
        if op not in ("head", "from", "until") or not arg:
            raise ExampleError(f"unknown cut {c!r} in {spec!r} (head N, from TEXT, until TEXT)")
        ops.append((op, arg))
    return argv[1:], ops


def run(spec: str) -> str:
    """What `spec` prints now: the command's stdout, cut as the spec says, each line right-stripped."""
    args, ops = _argv(spec)
    env = dict(os.environ, NO_COLOR="1", COLUMNS="100")
    env.pop("TRAINPROBE_DEBUG", None)
    p = subprocess.run([sys.executable, "-m", "trainprobe.agent", *args], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=TIMEOUT_S)
    if p.returncode not in (0, 1) or not p.stdout.strip():
        raise ExampleError(f"`{spec}` exited {p.returncode}: {p.stderr.strip()[-300:]}")
    lines = [ln.rstrip() for ln in p.stdout.splitlines()]
    for op, arg in ops:
        if op == "head":
            lines = lines[:int(arg)]
        elif op == "from":
            i = next((k for k, ln in enumerate(lines) if arg in ln), None)
            if i is None:
                raise ExampleError(f"`{spec}`: no line holds {arg!r}")
            lines = lines[i:]
        else:
            i = next((k for k, ln in enumerate(lines) if k and arg in ln), len(lines))
            lines = lines[:i]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


def comparable(text: str) -> list[str]:
    out = []
    for ln in text.splitlines():
        ln = ln.rstrip()
        for rx in TIMINGS:
            ln = rx.sub("<time>", ln)
        out.append(ln)
    return out


def stale(ex: Example, now: str) -> list[str]:
    """The diff between a block and what its command prints now ([] when they agree)."""
    a, b = comparable(ex.body), comparable(now)
    if a == b:
        return []
    return list(difflib.unified_diff(a, b, f"{ex.where} (in the docs)", f"`{ex.spec}` (now)", lineterm="", n=1))


def write(page: Path) -> int:
    """Rewrite every block of `page` with what its command prints now; the number changed."""
    text = page.read_text()
    changed = 0
    for ex in reversed(examples(page)):
        now = run(ex.spec)
        if comparable(ex.body) != comparable(now):
            changed += 1
        text = text[:ex.start] + now + text[ex.end:]
    page.write_text(text)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite the blocks with what the commands print now")
    args = ap.parse_args(argv)
    bad = 0
    for page in pages():
        if args.write:
            n = write(page)
            if n:
                print(f"{page.relative_to(REPO)}: {n} example(s) regenerated")
            continue
        for ex in examples(page):
            diff = stale(ex, run(ex.spec))
            if diff:
                bad += 1
                print("\n".join(diff))
    if bad:
        print(f"{bad} example(s) differ from what the commands print now: python scripts/docs_examples.py --write",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

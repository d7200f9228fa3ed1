"""The docs stay true: the README is short, every link resolves, and the worked examples of
docs/contributing.md are real code (blocks marked `file:` appear in that file; blocks marked `run`
run and succeed)."""
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO

DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
# Pages other changes add; a link to one of them is allowed before it lands.
PENDING = {"security.md", "cost.md", "ledger.md", "models.md", "fleet.md"}
BLOCK = re.compile(r"<!-- (file: (?P<file>\S+)|run) -->\n```python\n(?P<code>.*?)\n```", re.S)


def test_readme_is_a_short_page_for_users():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move reference material to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    text = page.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        dest = (page.parent / path).resolve()
        if dest.name in PENDING and dest.parent == DOCS:
            continue
        assert dest.exists(), f"{page.name} links to {target}, which does not exist"


def test_every_doc_page_is_indexed():
    index = (DOCS / "index.md").read_text()
    for page in DOCS.glob("*.md"):
        if page.name != "index.md":
            assert f"({page.name}" in index, f"docs/index.md does not link {page.name}"


BLOCKS = [(m.group("file"), m.group("code")) for m in BLOCK.finditer((DOCS / "contributing.md").read_text())]


def test_contributing_has_a_worked_example_for_each_extension_point():
    text = (DOCS / "contributing.md").read_text()
    for title in ("## Add a probe", "## Add a rule", "## Add a preflight check", "## Add a renderer"):
        assert title in text
    assert sum(1 for f, _ in BLOCKS if f is None) >= 4
    assert sum(1 for f, _ in BLOCKS if f) >= 4


@pytest.mark.parametrize("path,code", [b for b in BLOCKS if b[0]], ids=lambda v: v if isinstance(v, str) and "/" in v else "")
def test_quoted_code_is_the_real_code(path, code):
    assert code in (REPO / path).read_text(), f"docs/contributing.md quotes code that is not in {path}"


@pytest.mark.parametrize("code", [c for f, c in BLOCKS if f is None], ids=lambda c: c.splitlines()[-1][:40])
def test_runnable_examples_run(code):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr

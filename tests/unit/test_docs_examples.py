"""Every example output in README.md and docs/ is what the command prints now (scripts/docs_examples.py
generates them; `python scripts/docs_examples.py --write` regenerates them after a change)."""
import pytest

from scripts import docs_examples as de
from tests.helpers import REPO

EXAMPLES = [ex for page in de.pages() for ex in de.examples(page)]


def test_the_pages_show_generated_examples():
    where = {ex.page.relative_to(REPO).as_posix() for ex in EXAMPLES}
    assert {"README.md", "docs/usage.md", "docs/preflight.md"} <= where
    specs = {ex.spec for ex in EXAMPLES}
    assert any(s.startswith("trainprobe report tests/data/h200/live/bundles/starved.tar.gz") for s in specs)
    assert any("preflight" in s for s in specs) and any("ledger/bundles" in s for s in specs)


@pytest.mark.parametrize("ex", EXAMPLES, ids=lambda e: f"{e.where} {e.spec[:60]}")
def test_example_is_what_the_command_prints_now(ex):
    diff = de.stale(ex, de.run(ex.spec))
    assert not diff, "\n".join(diff) + "\nregenerate: python scripts/docs_examples.py --write"


def test_the_check_sees_a_changed_number_and_ignores_only_timings():
    ex = de.Example(REPO / "README.md", "trainprobe x", "expected speedup 8.21x\nhost.memlock   0.4 ms\n", 0, 0)
    assert de.stale(ex, "expected speedup 8.21x\nhost.memlock   7.5 ms\n") == []
    assert de.stale(ex, "expected speedup 6.95x\nhost.memlock   0.4 ms\n")


def test_an_example_runs_trainprobe_only():
    with pytest.raises(de.ExampleError):
        de.run("rm -rf /tmp/x")
    with pytest.raises(de.ExampleError):
        de.run("trainprobe report x | tail 3")

"""The validation ledger's command line (docs/ledger.md). The harness itself is scripts/ledger.py,
shared with the tests that check it without running its jobs."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scripts.ledger import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

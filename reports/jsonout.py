"""The canonical view: the Report document as one JSON object."""
from __future__ import annotations

import json
from typing import Any, TextIO


def render(report: dict[str, Any], stream: TextIO) -> None:
    json.dump(report, stream, indent=2, sort_keys=False, default=str)
    stream.write("\n")

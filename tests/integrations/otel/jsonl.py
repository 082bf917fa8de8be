"""A span exporter that appends each span to a file as one JSON line, flushed at once:
what a process that is SIGKILLed next has exported stays on disk for the test to read."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class JsonLines(SpanExporter):
    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.path.open("a") as f:
            for span in spans:
                f.write(span.to_json(indent=None) + "\n")
            f.flush()
        return SpanExportResult.SUCCESS


def read(*paths: Path) -> list[dict[str, Any]]:
    """The spans the files hold, in export order."""
    return [json.loads(line) for p in paths if p.exists() for line in p.read_text().splitlines()]

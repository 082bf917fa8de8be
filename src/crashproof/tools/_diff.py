"""Apply a unified diff to one file's text, strictly: every context and removed line
must match at the position the hunk states (no fuzz), so a patch either applies
exactly or is refused."""

from __future__ import annotations

import re

__all__ = ["PatchError", "apply_unified_diff"]

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(ValueError):
    """The diff is malformed or does not apply to the base text."""


def apply_unified_diff(base: str, diff: str) -> str:
    old = base.splitlines(keepends=True)
    out: list[str] = []
    pos = 0  # index in old of the next line not yet copied
    lines = diff.splitlines(keepends=True)
    i = 0
    saw_hunk = False
    while i < len(lines):
        line = lines[i]
        match = _HUNK.match(line)
        if not match:
            if saw_hunk and not line.startswith(("--- ", "+++ ", "diff ", "index ")):
                raise PatchError(f"unexpected line outside a hunk: {line.rstrip()!r}")
            i += 1
            continue
        saw_hunk = True
        start = int(match[1]) - 1 if int(match[2] or 1) else int(match[1])
        if start < pos or start > len(old):
            raise PatchError(f"hunk {line.strip()!r} is out of order or past the end")
        out.extend(old[pos:start])
        pos = start
        i += 1
        while i < len(lines) and not _HUNK.match(lines[i]):
            body = lines[i]
            tag, text = body[:1], body[1:]
            if body.startswith("\\"):  # "\ No newline at end of file"
                if out and out[-1].endswith("\n") and lines[i - 1][:1] in "+ ":
                    out[-1] = out[-1][:-1]
                i += 1
                continue
            if tag in (" ", "-"):
                if pos >= len(old) or _strip_nl(old[pos]) != _strip_nl(text):
                    found = old[pos].rstrip("\n") if pos < len(old) else "end of file"
                    raise PatchError(
                        f"line {pos + 1}: expected {text.rstrip(chr(10))!r}, found {found!r}"
                    )
                if tag == " ":
                    out.append(old[pos])
                pos += 1
            elif tag == "+":
                out.append(text)
            elif tag in ("\n", ""):  # a blank context line some tools emit without " "
                if pos >= len(old) or old[pos].strip("\n") != "":
                    raise PatchError(f"line {pos + 1}: expected an empty line")
                out.append(old[pos])
                pos += 1
            else:
                break
            i += 1
    if not saw_hunk:
        raise PatchError("no hunk (@@ -a,b +c,d @@) in the diff")
    out.extend(old[pos:])
    return "".join(out)


def _strip_nl(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text

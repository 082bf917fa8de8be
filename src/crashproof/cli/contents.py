"""``crashproof show RUN --step KEY``: what one step holds, printed for a person (the
console's step page in a terminal) or as JSON for a script."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from rich.console import Console
from rich.text import Text

from crashproof.journal.controls import safe
from crashproof.runtime.operations.contents import Prompt, StepContent
from crashproof.runtime.operations.requests import NOT_STORED

__all__ = ["content_json", "print_content"]


def content_json(content: StepContent) -> dict[str, Any]:
    """The step's contents as JSON (``--json``)."""
    return dataclasses.asdict(content)


def _block(out: Console, title: str, body: Any, style: str = "bold") -> None:
    text = body if isinstance(body, str) else json.dumps(body, indent=2, ensure_ascii=False)
    out.print(Text(title, style=style))
    out.print(Text(safe(text)), soft_wrap=True)


def _prompt(out: Console, prompt: Prompt) -> None:
    """The request, message by message (or why it is not shown)."""
    if prompt.refused is not None:
        out.print(Text(safe(f"request not shown: {prompt.refused}"), style="bold red"))
        return
    out.print(Text("request", style="bold underline"))
    for message in prompt.messages:
        role = str(message.get("role"))
        answers = f" (answers {message['answers']})" if message.get("answers") else ""
        if message.get("text"):
            _block(out, f"{role}{answers}", str(message["text"]))
        elif not message.get("tool_calls"):
            out.print(Text(safe(f"{role}{answers} (no text)"), style="bold"))
        for call in message.get("tool_calls", ()):
            _block(out, f"{role} calls {call.get('name')}", call.get("arguments"))
    if prompt.other:
        _block(out, "request arguments", prompt.other, "dim")


def print_content(out: Console, run_id: str, c: StepContent) -> None:
    """Every part of ``c`` the journal holds, each under its own heading."""
    out.print(Text(safe(f"step {c.key} of {run_id}: {c.kind}, {c.status}"), style="bold"))
    stored = c.prompt is not None and not (c.prompt.refused or "").startswith(NOT_STORED)
    if c.prompt is not None and stored:
        _prompt(out, c.prompt)
        out.print(Text("reply" if c.reply else "value", style="bold underline"))
    if c.reply is not None:
        r = c.reply
        facts = [r.api, r.model or "", f"finish: {r.finish}" if r.finish else ""]
        if c.usage:
            facts.append(f"usage {json.dumps(c.usage)}")
        if c.cost:
            facts.append(f"cost {c.cost:.4f}")
        if c.latency is not None:
            facts.append(f"{c.latency * 1000:.1f} ms")
        out.print(Text(safe(" · ".join(f for f in facts if f)), style="dim"))
        for message in r.messages:
            if message.get("text"):
                _block(out, f"{message.get('role', 'assistant')} said", str(message["text"]))
            for call in message.get("tool_calls", ()):
                _block(out, f"calls {call.get('name')}", call.get("arguments"))
        if not stored:
            out.print(
                Text(
                    "(the request's messages are bound by their digest only, not stored)",
                    style="dim",
                )
            )
    if c.params is not None:
        _block(out, f"params{f' of {c.tool}' if c.tool else ''}", c.params)
    if c.diff:
        out.print(Text("change", style="bold"))
        for line in c.diff.splitlines():
            added = line.startswith("+") and not line.startswith("+++")
            removed = line.startswith("-") and not line.startswith("---")
            out.print(Text(safe(line), style="green" if added else "red" if removed else ""))
    if c.has_value and c.reply is None:
        _block(out, "receipt result" if c.kind == "act" else "value", c.value)
    if c.error:
        _block(out, "error", f"{c.error.get('type')}: {c.error.get('message')}", "bold red")
        if c.error.get("traceback"):
            out.print(Text(safe(str(c.error["traceback"]))), soft_wrap=True)
    for attempt in c.attempts:
        error = attempt.get("error") or {}
        line = (
            f"attempt {attempt.get('attempt')} failed: {error.get('type')}: {error.get('message')}"
        )
        out.print(Text(safe(line), style="dim"))

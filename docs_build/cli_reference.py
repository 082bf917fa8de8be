"""An mkdocs hook: the CLI reference page is generated at build time from the Typer app
itself (every command's usage, help and options, as ``crashproof CMD --help`` has them),
so the page cannot drift from the code. The marker ``<!-- cli-reference -->`` in a page
is replaced by it."""

from __future__ import annotations

import html
from typing import Any

MARKER = "<!-- cli-reference -->"


def _rows(command: Any, ctx: Any) -> list[str]:
    rows = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:  # an argument: typer gives it no help record unless documented
            if getattr(param, "param_type_name", "") == "argument":
                record = (param.human_readable_name, getattr(param, "help", None) or "")
            else:
                continue
        names, text = record
        text = " ".join(text.split())
        rows.append(f"| `{names}` | {html.escape(text).replace('|', '&#124;')} |")
    return rows


def _section(command: Any, path: list[str], parent: Any) -> list[str]:
    ctx = command.make_context(" ".join(path), [], parent=parent, resilient_parsing=True)
    usage = " ".join([*path, *command.collect_usage_pieces(ctx)])
    out = [f"{'#' * min(len(path) + 1, 4)} `{' '.join(path)}`", "", f"```text\n{usage}\n```", ""]
    if command.help:
        # typer renders help as Markdown; an epilog table (exit codes) only at the root
        out += [command.help.strip(), ""]
    rows = _rows(command, ctx)
    if rows:
        out += ["| option | meaning |", "|---|---|", *rows, ""]
    if len(path) == 1 and command.epilog:
        out += ["**Exit codes**", "", command.epilog.strip(), ""]
    for name in getattr(command, "list_commands", lambda c: [])(ctx):
        sub = command.get_command(ctx, name)
        if sub is not None and not sub.hidden:
            out += _section(sub, [*path, name], ctx)
    return out


def reference() -> str:
    """The whole CLI reference, in Markdown."""
    import typer

    from crashproof.cli.app import app

    return "\n".join(_section(typer.main.get_command(app), ["crashproof"], None))


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return markdown.replace(MARKER, reference()) if MARKER in markdown else markdown

"""The CLI's commands, as plain functions; ``crashproof.cli.app`` registers them.

One module per group of commands. None of them imports ``crashproof.cli.app``: their
typer option and argument declarations sit on the functions' parameters, and typer
reads them when app.py registers each function, so no import circle goes through app.
"""

"""crashproof's native modules, optional speed-ups of a pure-Python package: the v2 record
MAC in C over OpenSSL's SHA-256 (src/crashproof/integrity/_seal.c), and the CLI's SIGBUS
message (src/crashproof/cli/_sigbus.c). Without them crashproof seals the same bytes in
Python, and a SIGBUS ends the process without its message (the shell still says "Bus
error", exit 135).

$CRASHPROOF_NATIVE chooses, for every build (wheel, sdist install, editable install):
  unset or 0   none: a pure ``py3-none-any`` wheel, no compiler needed (the default, and
               what `python -m build` publishes);
  auto         build them where a compiler and OpenSSL's headers are, else go on without;
  1            build them or fail the build (CI: a broken build must not hide behind the
               fallback).
The Makefile's dev install uses ``auto``; .ci/run uses ``1``.
Everything else about the package is in pyproject.toml."""

import os

from setuptools import Extension, setup

_CHOICES = {"": None, "0": None, "auto": True, "1": False}  # value -> Extension(optional=)
_choice = os.environ.get("CRASHPROOF_NATIVE", "").strip().lower()
if _choice not in _CHOICES:
    raise SystemExit(
        f"crashproof: $CRASHPROOF_NATIVE is {_choice!r}; use 0 (pure Python, the default), "
        "auto (native where it builds) or 1 (native or fail)"
    )
_optional = _CHOICES[_choice]

setup(
    ext_modules=[]
    if _optional is None
    else [
        Extension(
            "crashproof.integrity._seal",
            sources=["src/crashproof/integrity/_seal.c"],
            libraries=["crypto"],
            extra_compile_args=["-O2"],
            optional=_optional,
        ),
        # One error line before SIGBUS ends the process (a ledger file made immutable).
        Extension(
            "crashproof.cli._sigbus",
            sources=["src/crashproof/cli/_sigbus.c"],
            extra_compile_args=["-O2"],
            optional=_optional,
        ),
    ]
)

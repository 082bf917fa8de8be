"""crashproof's native modules, both optional: the v2 record MAC in C over OpenSSL's
SHA-256 (src/crashproof/integrity/_seal.c), and the CLI's SIGBUS message
(src/crashproof/cli/_sigbus.c). Where no compiler or OpenSSL headers are found, the
build goes on without them: crashproof seals the same bytes in Python, and a SIGBUS
ends the process without its message.
Everything else about the package is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "crashproof.integrity._seal",
            sources=["src/crashproof/integrity/_seal.c"],
            libraries=["crypto"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        # One error line before SIGBUS ends the process (a ledger file made immutable).
        Extension(
            "crashproof.cli._sigbus",
            sources=["src/crashproof/cli/_sigbus.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)

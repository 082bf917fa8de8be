"""crashproof's one native module, optional: the v2 record MAC in C over OpenSSL's
SHA-256 (src/crashproof/integrity/_seal.c). Where no compiler or OpenSSL headers are
found, the build goes on without it and crashproof seals the same bytes in Python.
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
        )
    ]
)

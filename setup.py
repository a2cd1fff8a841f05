# The one compiled part: sessionstore.wire._cbor_bytes, the CBOR byte helper
# (client/sessionstore/wire/cbor_core.c). Everything else is in pyproject.toml. The
# extension is optional: where no C compiler works, the build goes on without it
# and the pure-Python path runs (sessionstore.wire.cbor_bytes says which one does).
from setuptools import Extension, setup

HELPER_SOURCES = ["client/sessionstore/wire/_cbor_bytes.c", "client/sessionstore/wire/cbor_core.c"]

setup(
    ext_modules=[
        Extension(
            "sessionstore.wire._cbor_bytes",
            sources=HELPER_SOURCES,
            depends=["client/sessionstore/wire/cbor_core.h"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra"],
            optional=True,
        )
    ]
)

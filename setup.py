# What is compiled; everything else is in pyproject.toml. Both parts are optional:
# where they cannot be built, the same source runs interpreted.
# - sessionstore.wire._cbor_bytes, the CBOR byte helper (client/sessionstore/wire/
#   cbor_core.c), whenever a C compiler works (sessionstore.wire.cbor_bytes says which
#   helper runs);
# - the daemon's request path, compiled by mypyc from its typed source, when mypyc is
#   importable where this runs (make installs the package a second time, without build
#   isolation, in the venv that has mypy and the dependencies mypy reads) and a C
#   compiler is found. SESSIONSTORE_BUILD=interpreted at build time leaves it out.
#   The list of modules is sessionstore/compiled_modules.py (sessionstore.build says at
#   run time which build runs).
import os
import runpy
import shutil
import sysconfig

from setuptools import Extension, setup

HELPER_SOURCES = ["client/sessionstore/wire/_cbor_bytes.c", "client/sessionstore/wire/cbor_core.c"]
PACKAGE_DIRS = {"sessionstore": "client/sessionstore", "sessionstored": "daemon/sessionstored"}
BUILD_LIST = "client/sessionstore/compiled_modules.py"


def cbor_helper() -> Extension:
    return Extension(
        "sessionstore.wire._cbor_bytes",
        sources=HELPER_SOURCES,
        depends=["client/sessionstore/wire/cbor_core.h"],
        extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra"],
        optional=True,
    )


def compiler_found() -> bool:
    compiler = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shutil.which(compiler.split()[0]) is not None


def compiled_request_path() -> list[Extension]:
    if os.environ.get("SESSIONSTORE_BUILD") == "interpreted" or not compiler_found():
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:  # an isolated build: no mypy there
        return []
    build = runpy.run_path(BUILD_LIST)
    extensions: list[Extension] = []
    for package, paths in build["COMPILED_GROUPS"].items():
        sources = [f"{PACKAGE_DIRS[package]}/{path}" for path in paths]
        group = f"{package}.{build['GROUP']}"
        extensions += mypycify(sources, group_name=group, opt_level="3")
    for extension in extensions:
        extension.optional = True  # a compiler that fails: the build goes on, interpreted
    return extensions


setup(ext_modules=[cbor_helper(), *compiled_request_path()])

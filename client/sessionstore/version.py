# The one place the version is written: the package metadata (pyproject.toml reads
# it), both commands' --version, and the daemon's `hello` take it from here.
__version__ = "0.2.0"

# The daemon package; its version is the project's one (sessionstore/version.py).
from sessionstore.version import __version__

__all__ = ["__version__"]

# The daemon package; its version is the project's one (sessionstore/version.py).
# Before any of its modules is imported: which build of them runs (sessionstore/build.py).
from sessionstore.build import choose_build
from sessionstore.version import __version__

choose_build(__name__, __path__)

__all__ = ["__version__"]

# Imported by the worker processes' fork server as it starts (offload.py names it
# in set_forkserver_preload), and by nothing else: the fork server dies with the
# daemon.
from __future__ import annotations

from .parent_death import die_with_parent

die_with_parent()

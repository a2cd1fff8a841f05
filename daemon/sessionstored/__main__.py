import sys

from .commands.entry import main

sys.exit(main())

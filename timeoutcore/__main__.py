"""``python -m timeoutcore``: see :mod:`timeoutcore.cli`."""

import sys

from .cli import main

sys.exit(main())

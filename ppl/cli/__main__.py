"""``python -m ppl.cli``: the ``ppl`` command."""

import sys

from ppl.cli import main

sys.exit(main())

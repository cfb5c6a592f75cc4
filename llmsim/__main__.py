"""``python -m llmsim``: the ``llmsim`` command."""

import sys

from llmsim.cli import main

if __name__ == "__main__":
    sys.exit(main())

"""``python -m specstate``: the ``specstate`` command line."""

from __future__ import annotations

import sys

from specstate.cli import main

if __name__ == "__main__":
    sys.exit(main())

"""`python -m backend.cli`: the headless CLI's entry (backend.cli.app holds the commands)."""

import sys

from backend.cli.app import main

if __name__ == "__main__":
    sys.exit(main())

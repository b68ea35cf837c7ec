"""`python -m hitoban VERB ...`: the `hitoban` command (hitoban.cli), as the console script runs it."""

import sys

from hitoban.cli import main

if __name__ == "__main__":
    sys.exit(main())

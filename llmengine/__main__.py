"""`python -m llmengine` runs the same command line as the `llmengine` script."""

import sys

from llmengine.cli import main

if __name__ == "__main__":
    sys.exit(main())

"""`python -m forgetlab` runs the CLI."""
import sys

from forgetlab.cli import main

sys.exit(main())

"""`python -m wgrad.bench [options]`, the same as `python -m wgrad bench [options]`."""

import sys

from .cli import main

sys.exit(main())

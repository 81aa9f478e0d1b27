"""`python -m dispatcher`: run hoss-dispatcher (the same as the `hoss-dispatcher` console script)."""

import sys

from dispatcher.main import main

sys.exit(main())

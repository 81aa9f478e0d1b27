"""`python -m workers`: run hoss-worker (the same as the `hoss-worker` console script)."""

import sys

from workers.main import main

sys.exit(main())

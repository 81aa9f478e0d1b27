"""`python -m rescheduler`: run hoss-rescheduler (the same as the `hoss-rescheduler` console script)."""

import sys

from rescheduler.main import main

sys.exit(main())

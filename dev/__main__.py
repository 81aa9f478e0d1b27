import sys

from dev.cli import main

sys.exit(main())

import sys

from delegation.runner.cli import main

sys.exit(main())

import sys

from rayfabric.cli import main

sys.exit(main())

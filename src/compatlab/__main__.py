import sys

from compatlab.cli import main

sys.exit(main())

import sys

from xspec.cli import main

sys.exit(main())

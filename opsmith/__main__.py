import sys

from opsmith.cli import main

sys.exit(main())

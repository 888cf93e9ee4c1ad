import sys

from apexkit.cli import main

sys.exit(main())

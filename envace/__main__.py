import sys

from envace.cli import main

sys.exit(main())

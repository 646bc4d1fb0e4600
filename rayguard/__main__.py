import sys

from rayguard.cli import main

sys.exit(main())

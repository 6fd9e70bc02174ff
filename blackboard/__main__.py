import sys

from blackboard.cli import main

sys.exit(main())

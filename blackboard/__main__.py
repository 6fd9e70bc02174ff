import sys

from blackboard.apps.cli import main

sys.exit(main())

import sys

from graphshard.harness.cli import main

sys.exit(main())

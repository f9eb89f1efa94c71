"""``python -m engine ...``: see ``shardmd.engine.cli``."""
import sys

from shardmd.engine.cli import main

sys.exit(main())

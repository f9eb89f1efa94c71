"""``python -m engine ...``: see ``shardmd.engine.cli.main``."""
import sys

if sys.argv[1:2] == ["run"]:
    # before the imports (seconds): a batch system's SIGTERM now is a stop, not a death
    from shardmd.engine.launch.stop import install_early

    install_early()

from shardmd.engine.cli.main import main
from shardmd.engine.launch.parallel import exit_now

exit_now(main())

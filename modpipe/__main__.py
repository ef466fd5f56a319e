import sys

from modpipe.cli import main

sys.exit(main())

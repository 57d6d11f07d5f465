import sys

from geograph.cli import main

sys.exit(main())

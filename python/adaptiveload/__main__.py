import sys

from adaptiveload.cli import main

sys.exit(main())

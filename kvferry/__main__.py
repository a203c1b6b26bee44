import sys

from kvferry.cli import main

sys.exit(main())

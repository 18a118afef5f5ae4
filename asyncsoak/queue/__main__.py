import sys

from ._worker import main

sys.exit(main())

"""``python -m gshare.gpukit``: the GPU kit's orchestrator (``gshare.gpukit.check``)."""

import sys

from gshare.gpukit.check import main

sys.exit(main())

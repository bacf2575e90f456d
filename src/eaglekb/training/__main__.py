"""``python -m eaglekb.training --config RUN.json``: the torchrun entry of drafter training."""

import sys

from eaglekb.training.loop import main

sys.exit(main())

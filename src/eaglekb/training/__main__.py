"""``python -m eaglekb.training --config RUN.json``: the torchrun entry of drafter training."""

import sys

from eaglekb.training.launch import main

sys.exit(main())

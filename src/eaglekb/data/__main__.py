"""``python -m eaglekb.data --config RUN.json --rank R --world N``: one process of a multi-GPU datagen."""

import sys

from eaglekb.data.launch import main

sys.exit(main())

"""python -m experiments.hetero_scheduler: the whole study from one command (see study.py)."""
import sys

from .study import main

sys.exit(main())

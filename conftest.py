"""Settings for every pytest run, unit tests and notebooks (nbmake kernels inherit them).

One intra-op thread: the models here are small enough that thread start-up costs more than
it saves, two runs sharing two cores each oversubscribe them badly, and a fixed thread count
keeps floating-point reductions in one order on every machine.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

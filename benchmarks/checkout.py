"""Puts this checkout first on `sys.path`, before anything of ours is imported, so that
`python benchmarks/x.py` reads the library and program of the tree it is in: where no
package is installed (the GPU machine's copy) and where another checkout is (gpu_all.sh's
BEFORE, an earlier copy whose scripts must not import this one's program)."""

import os
import sys

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path[:1] != [REPOSITORY]:
    sys.path.insert(0, REPOSITORY)

"""specscribe's fronts (installed as the `specscribe` package).

`config` is imported first: it sets the environment's defaults (offline libraries, OpenMP's
wait policy) that the libraries read as they load, so whichever front is imported first, they
are set before torch loads.
"""

from . import config  # noqa: F401

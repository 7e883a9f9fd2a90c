"""openstarry: an agent core for Python whose hot path is Rust.

The Rust core is :mod:`openstarry.core`; it needs nothing beyond the standard
library. Exceptions live in :mod:`openstarry.errors`.
"""

from openstarry._core import __version__

__all__ = ["__version__"]

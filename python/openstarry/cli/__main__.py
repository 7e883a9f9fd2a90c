"""``python -m openstarry.cli``: the ``openstarry`` command."""

from __future__ import annotations

import sys

from openstarry.cli.entry import main

sys.exit(main())

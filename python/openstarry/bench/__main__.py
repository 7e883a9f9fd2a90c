"""``python -m openstarry.bench [latency|bus|loop] ...``: the same as ``openstarry bench``."""

from openstarry.bench import main

raise SystemExit(main())

"""``python -m sglang_fl.smoke [--layer 1|2|3|all] [--json]`` -- see `sglang_fl.smoke`."""

from sglang_fl.smoke.runner import main

raise SystemExit(main())

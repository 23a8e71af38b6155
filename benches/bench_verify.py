"""The benchmark suite of ``specaccept.verify`` (see ``specaccept/_bench.py`` for what it
measures): ``python benches/bench_verify.py [--quick] [--markdown] [--plot FILE]``.

Results go to ``benches/results/verify.json`` (and ``.csv``) unless ``--out`` says
otherwise; ``--quick`` runs write to the temporary directory. ``python -m specaccept
bench`` runs the same code.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness import main

if __name__ == "__main__":
    quick = "--quick" in sys.argv[1:]
    main(default_out=None if quick else Path(__file__).parent / "results" / "verify.json")

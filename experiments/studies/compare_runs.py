"""Same results before and after a change: two runs of the same command on the same seed compared.

The code is :mod:`memalpha_lab.compare_runs` (tests import it from there);
this is its command line:
    .venv/bin/python experiments/studies/compare_runs.py --help
"""

from memalpha_lab.compare_runs import main

if __name__ == "__main__":
    raise SystemExit(main())

"""The pre-registered decisive experiment's verdict, rebuilt from its committed files alone.

The code is :mod:`memalpha_lab.decisive_report` (tests import it from there);
this is its command line:
    .venv/bin/python experiments/studies/decisive_report.py --help
"""

from memalpha_lab.decisive_report import main

if __name__ == "__main__":
    raise SystemExit(main())

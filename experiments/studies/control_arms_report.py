"""Rebuild every interval of the control-arms experiment from its committed files alone.

The code is :mod:`memalpha_lab.control_arms_report` (tests import it from there);
this is its command line:
    .venv/bin/python experiments/studies/control_arms_report.py --help
"""

from memalpha_lab.control_arms_report import main

if __name__ == "__main__":
    raise SystemExit(main())

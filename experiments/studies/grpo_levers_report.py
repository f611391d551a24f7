"""Rebuild every interval of the GRPO-levers experiment from its committed files alone.

The code is :mod:`memalpha_lab.grpo_levers_report` (tests import it from there);
this is its command line:
    .venv/bin/python experiments/studies/grpo_levers_report.py --help
"""

from memalpha_lab.grpo_levers_report import main

if __name__ == "__main__":
    raise SystemExit(main())

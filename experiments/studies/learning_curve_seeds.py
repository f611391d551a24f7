"""Learning curve over seeds: each seed's paired held-out change, and their mean with a t interval over seeds.

Run:
    .venv/bin/python experiments/studies/learning_curve_seeds.py experiments/results/learning_curve_q4.json \\
        experiments/results/learning_curve_q4_seed1.json experiments/results/learning_curve_q4_seed2.json

Each input is a report of ``experiments/studies/learning_curve.py``; every seed run in it contributes
its last-validation-minus-start change over all instances (paired over the same held-out
instances, with its own 95 % interval). The across-seed line is the mean of those per-seed
means with a 95 % t interval over seeds (``n - 1`` degrees of freedom): it asks whether the
gain holds from seed to seed, not only within one run's instances. The runs should share the
recipe (steps, validation instances, questions); the script refuses reports whose settings
differ beyond the seed. Writes ``experiments/results/learning_curve_seeds.json`` (``--out``). The
arithmetic is :mod:`memalpha_lab.across_seeds` (the tests check it there).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from memalpha_lab.across_seeds import combine
from memalpha_lab.common import command_line, print_table, write_json
from memalpha_lab.stats import METRICS

RESULTS = Path(__file__).resolve().parents[1] / "results" / "learning_curve_seeds.json"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="learning_curve.py JSON reports")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON report path")
    args = parser.parse_args(argv)
    reports = {}
    for path in args.reports:
        try:
            reports[str(path)] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            parser.error(f"{path}: {error}")
    try:
        result = combine(reports)
    except ValueError as error:
        parser.error(str(error))

    def cell(value: dict[str, float]) -> str:
        return f"{value['mean']:+.3f} ± {value['half_width']:.3f}"

    rows = [[f"seed {run['seed']}"] + [cell(run["change"][m]) for m in METRICS] for run in result["runs"]]
    rows.append([f"across {len(result['runs'])} seeds"] + [cell(result["across_seeds"][m]) for m in METRICS])
    print_table(["last - start", *METRICS], rows)
    print("seeds whose own change rose beyond its own interval: "
          + ", ".join(f"{m} {result['seeds_rising_beyond_own_interval'][m]}" for m in METRICS))
    report = {"benchmark": "learning_curve_seeds", "command": command_line(),
              "inputs": [str(p) for p in args.reports], **result}
    print(f"wrote {write_json(report, args.out)}")
    return report


if __name__ == "__main__":
    main()

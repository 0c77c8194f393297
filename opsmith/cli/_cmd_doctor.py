"""`opsmith doctor`: run every check and print the table or JSON."""
from __future__ import annotations

import sys


def run(args) -> int:
    from opsmith.cli import _doctor_report as report
    from opsmith.cli._doctor import run_checks
    rows = run_checks()
    if args.json:
        print(report.to_json(rows))
    else:
        report.render(rows, sys.stdout)
    return report.exit_code(rows)

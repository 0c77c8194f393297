"""`opsmith doctor`: run every check and print the table or JSON."""
from __future__ import annotations

import sys

def run(args) -> int:
    from opsmith.cli import _doctor as _checks
    rows = _checks.run_checks()
    if args.json:
        print(_checks.to_json(rows))
    else:
        _checks.render(rows, sys.stdout)
    return _checks.exit_code(rows)

"""`opsmith settings`: the values in effect, or the docs page."""
from __future__ import annotations

import os
import sys

def _settings(args) -> int:
    from opsmith._config import settings, settings_markdown
    from opsmith.cli._cmd_cache import print_table
    from opsmith._errors import ConfigError
    if args.markdown:
        sys.stdout.write(settings_markdown())
        return 0
    rows = []
    for st in settings.describe():
        source = next((v for v in st.env if os.environ.get(v)), None)
        try:
            value = getattr(settings, st.name)
            shown = "unset" if value is None else str(value)
        except ConfigError:
            shown = f"INVALID: {os.environ.get(source or '', '')!r}"
        rows.append((st.name, shown, source or "default", " ".join(st.env)))
    print_table(("SETTING", "VALUE", "FROM", "VARIABLES"), rows)
    return 0



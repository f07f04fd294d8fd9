"""Results as JSON: frames as records, NumPy scalars as Python ones (what `--format json` prints)."""
from __future__ import annotations

import json


def records(df) -> list[dict]:
    """A frame as JSON-ready records (NaN -> None, numpy scalars -> Python), as the CLI prints them."""
    return json.loads(df.to_json(orient="records"))


def _plain(x):
    import numpy as np
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def dumps(obj) -> str:
    return json.dumps(obj, indent=2, default=_plain)

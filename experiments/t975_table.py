"""Write servesim/t975.py: Student-t 0.975 quantiles (scipy.special.stdtrit) for every degrees of
freedom `servesim.intervals` uses, so that a run's intervals do not import scipy.special (~0.1 s).

    python experiments/t975_table.py        # after a change of intervals.K_MIN / K_MAX or of scipy
tests/test_intervals.py checks the table against stdtrit, value for value.
"""
from __future__ import annotations

import sys
from pathlib import Path

import scipy
from scipy.special import stdtrit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servesim.intervals import table_dfs  # noqa: E402

OUT = ROOT / "servesim" / "t975.py"


def main():
    rows = "".join(f"    {df!r}: {float(stdtrit(df, 0.975))!r},\n" for df in table_dfs())
    OUT.write_text(
        '"""Student-t 0.975 quantiles by degrees of freedom: the df `intervals` uses (`intervals.table_dfs`),\n'
        f"from scipy.special.stdtrit (scipy {scipy.__version__}); written by experiments/t975_table.py,\n"
        'checked value for value by tests/test_intervals.py. Other df: `intervals._t` asks scipy."""\n'
        "T975 = {\n" + rows + "}\n")
    print(f"wrote {OUT} ({len(table_dfs())} values)")


if __name__ == "__main__":
    main()

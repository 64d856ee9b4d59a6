"""Kill rate of a cosmic-ray session, the filtered (skipped) mutants left out: python mutation/rate.py S.sqlite"""

from __future__ import annotations

import sqlite3
import sys


def main(path: str) -> None:
    con = sqlite3.connect(path)
    counts = dict(con.execute(
        "select test_outcome, count(*) from work_results where test_outcome is not null group by test_outcome"
    ).fetchall())
    killed, survived = counts.get("KILLED", 0), counts.get("SURVIVED", 0)
    incompetent = counts.get("INCOMPETENT", 0)
    total = killed + survived + incompetent
    print(f"{path}: {total} mutants run, {killed + incompetent} killed, {survived} survived, "
          f"kill rate {100 * (killed + incompetent) / max(total, 1):.1f}%")
    for row, _col, op, diff in con.execute(
        "select s.start_pos_row, s.start_pos_col, s.operator_name, r.diff from work_results r "
        "join mutation_specs s on s.job_id = r.job_id where r.test_outcome = 'SURVIVED' order by s.start_pos_row"
    ):
        changed = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
        print(f"  line {row}: {op.split('/')[-1]}: {' => '.join(c[1:].strip() for c in changed)}")


if __name__ == "__main__":
    main(sys.argv[1])

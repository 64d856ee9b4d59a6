"""Mark as skipped every mutant outside a line range: python mutation/only_lines.py S.sqlite FIRST-LAST"""

from __future__ import annotations

import sqlite3
import sys


def main(path: str, lines: str) -> None:
    first, last = (int(x) for x in lines.split("-"))
    con = sqlite3.connect(path)
    outside = con.execute(
        "select s.job_id from mutation_specs s left join work_results r on r.job_id = s.job_id "
        "where r.job_id is null and (s.start_pos_row < ? or s.start_pos_row > ?)", (first, last)
    ).fetchall()
    con.executemany(
        "insert into work_results (worker_outcome, output, test_outcome, diff, job_id) "
        "values ('SKIPPED', 'outside the lines under test', NULL, NULL, ?)", outside
    )
    con.commit()
    print(f"{len(outside)} mutants outside lines {first}-{last} skipped")


if __name__ == "__main__":
    main(*sys.argv[1:3])

"""Mark as skipped, in a fresh cosmic-ray session, every mutant that an earlier session killed.

    python mutation/only_survivors.py EARLIER.sqlite NEW.sqlite

Mutants are matched by operator, occurrence and position. What an earlier run killed stays killed
as long as its tests are still in the run, so an `after` run need only retry the survivors.
"""

from __future__ import annotations

import sqlite3
import sys

KEY = "s.operator_name, s.occurrence, s.start_pos_row, s.start_pos_col"


def main(earlier: str, new: str) -> None:
    old = sqlite3.connect(earlier)
    survived = set(old.execute(
        f"select {KEY} from mutation_specs s join work_results r on r.job_id = s.job_id "
        "where r.test_outcome = 'SURVIVED'"
    ).fetchall())
    con = sqlite3.connect(new)
    pending = con.execute(
        f"select s.job_id, {KEY} from mutation_specs s left join work_results r on r.job_id = s.job_id "
        "where r.job_id is null"
    ).fetchall()
    skip = [(job_id,) for job_id, *key in pending if tuple(key) not in survived]
    con.executemany(
        "insert into work_results (worker_outcome, output, test_outcome, diff, job_id) "
        "values ('SKIPPED', 'killed in the earlier session', NULL, NULL, ?)", skip
    )
    con.commit()
    print(f"{len(pending) - len(skip)} earlier survivors to retry, {len(skip)} skipped")


if __name__ == "__main__":
    main(*sys.argv[1:3])

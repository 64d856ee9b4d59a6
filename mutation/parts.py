"""Split a cosmic-ray session's pending mutants over several sessions that run side by side, and merge back.

    python mutation/parts.py split S.sqlite N   # writes S.part0.sqlite ... S.part{N-1}.sqlite
    python mutation/parts.py merge S.sqlite S.part0.sqlite ...

A part skips every pending mutant of the other parts; `cosmic-ray exec` on a part runs only its own (each part
in its own scratch copy: cosmic-ray mutates the module in place). `merge` copies the parts' results of the
mutants still pending in S into S, so that mutation/rate.py S.sqlite reports the whole session.
"""

from __future__ import annotations

import shutil
import sqlite3
import sys

_PENDING = (
    "select s.job_id from mutation_specs s left join work_results r on r.job_id = s.job_id "
    "where r.job_id is null order by s.job_id"
)


def split(path: str, n: int) -> None:
    pending = [job for (job,) in sqlite3.connect(path).execute(_PENDING)]
    for part in range(n):
        out = path.replace(".sqlite", f".part{part}.sqlite")
        shutil.copy(path, out)
        con = sqlite3.connect(out)
        con.executemany(
            "insert into work_results (worker_outcome, output, test_outcome, diff, job_id) "
            "values ('SKIPPED', 'another part', NULL, NULL, ?)",
            [(job,) for k, job in enumerate(pending) if k % n != part],
        )
        con.commit()
        print(f"{out}: {len(pending[part::n])} of {len(pending)} pending mutants")


def merge(path: str, parts: list[str]) -> None:
    con = sqlite3.connect(path)
    pending = {job for (job,) in con.execute(_PENDING)}
    copied = 0
    for part in parts:
        rows = sqlite3.connect(part).execute(
            "select worker_outcome, output, test_outcome, diff, job_id from work_results "
            "where not (worker_outcome = 'SKIPPED' and output = 'another part')"
        ).fetchall()
        new = [row for row in rows if row[4] in pending]
        con.executemany(
            "insert into work_results (worker_outcome, output, test_outcome, diff, job_id) values (?, ?, ?, ?, ?)", new
        )
        pending -= {row[4] for row in new}
        copied += len(new)
    con.commit()
    print(f"{copied} results merged, {len(pending)} mutants still pending")


if __name__ == "__main__":
    if sys.argv[1] == "split":
        split(sys.argv[2], int(sys.argv[3]))
    else:
        merge(sys.argv[2], sys.argv[3:])

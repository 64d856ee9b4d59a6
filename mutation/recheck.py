"""Retry an earlier session's surviving mutants against new tests only, without cosmic-ray.

    python mutation/recheck.py REV MODULE "TEST FILES" S.sqlite [S2.sqlite ...] [--pytest-args "..."]

Each survivor's diff (as cosmic-ray stored it) is applied to MODULE as commit REV has it, in a scratch copy of
REV (/tmp/hetero-infer-recheck, with the same hetero_infer shim as run.sh) with TEST FILES copied from the
working tree, and TEST FILES run on it. The survivors passed the earlier tests already, so the new tests alone
decide; each line printed names the mutant, KILLED or SURVIVED and the failing tests. Results are appended to
recheck.tsv in the scratch folder, and a mutant already there is not run again.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK = Path("/tmp/hetero-infer-recheck")


def _scratch(rev: str) -> None:
    if (WORK / ".rev").exists() and (WORK / ".rev").read_text() == rev:
        return
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(WORK)], input=archive, check=True)
    for sub in ("worker", "kernels", "operator"):
        (WORK / "hetero_infer" / sub).symlink_to(f"../{sub}")
    (WORK / "_shim").mkdir()
    (WORK / "_shim" / "hetero_infer").symlink_to("../hetero_infer")
    (WORK / ".rev").write_text(rev)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rev")
    ap.add_argument("module")
    ap.add_argument("tests")
    ap.add_argument("sessions", nargs="+")
    ap.add_argument("--pytest-args", default="")
    ap.add_argument("--timeout", type=int, default=400)
    a = ap.parse_args()
    _scratch(a.rev)
    original = subprocess.run(["git", "-C", str(REPO), "show", f"{a.rev}:{a.module}"], check=True,
                              capture_output=True, text=True).stdout
    tests = a.tests.split()
    log = WORK / "recheck.tsv"
    done = {line.split("\t")[0] for line in log.read_text().splitlines()} if log.exists() else set()
    command = (f"env PYTHONPATH={WORK}/_shim PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout {a.timeout} python -m pytest -q "
               f"-p no:cacheprovider -p hypothesis -p pytest_timeout {a.pytest_args} {' '.join(tests)}")
    try:
        for session in a.sessions:
            survivors = sqlite3.connect(session).execute(
                "select s.job_id, s.start_pos_row, s.operator_name, r.diff from work_results r join mutation_specs s "
                "on s.job_id = r.job_id where r.test_outcome = 'SURVIVED' order by s.start_pos_row").fetchall()
            for job, row, op, diff in survivors:
                if job in done:
                    continue
                (WORK / a.module).write_text(original)
                for test in tests:
                    shutil.copy(REPO / test, WORK / test)
                subprocess.run(["patch", "-p1", "-s"], input=diff.split("--- mutation diff ---\n")[-1] + "\n",
                               text=True, cwd=WORK, check=True)
                run = subprocess.run(command, shell=True, cwd=WORK, capture_output=True, text=True)
                failed = [ln.split(" ")[1].split("::")[-1] for ln in run.stdout.splitlines() if ln.startswith("FAILED")]
                if run.returncode and not failed:
                    failed = [f"(exit {run.returncode})"]
                changed = [ln[1:].strip() for ln in diff.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
                line = "\t".join([job, f"line {row}", op.split("/")[-1], " => ".join(changed),
                                  "KILLED" if run.returncode else "SURVIVED", " ".join(failed)])
                print(line, flush=True)
                with log.open("a") as f:
                    f.write(line + "\n")
                done.add(job)
    finally:
        (WORK / a.module).write_text(original)


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Mutation-test one module in a scratch copy of the working tree (never in place: the
# working tree may be shared, and a mutant left behind by a killed run would break it).
#
#   mutation/run.sh MODULE_PATH "TEST FILES..." [extra pytest args]
#   e.g. mutation/run.sh worker/core/block_manager.py "tests/engine/test_block_manager_properties.py"
#
# Needs cosmic-ray (pip install cosmic-ray==8.7.0, see docs/testing.md). Environment:
#   MUT_DIR      scratch copy (default /tmp/hetero-infer-mut); recreated on each run
#   MUT_TIMEOUT  seconds per mutant before it counts as killed by timeout (default 60)
#   COSMIC_RAY   the cosmic-ray executable (default: cosmic-ray on PATH)
#   MUT_REV      take the files from this commit (git archive) instead of the working tree
#   MUT_ADD      with MUT_REV: paths copied from the working tree over that commit's files (a new
#                test file written after MUT_REV, run against the module as MUT_REV has it)
#   MUT_EARLIER  an earlier session's .sqlite: retry only the mutants that survived it
#   MUT_LINES    FIRST-LAST: mutate only these lines (one function of a larger module)
# Prints the survivors' diffs and the kill rate; the session database stays in MUT_DIR.
set -euo pipefail
# Edit this file by writing a new one and renaming it over (mv): bash reads a running script as it
# goes, so an in-place edit shifts what a running session executes next.
module=$1
tests=$2
extra=${3:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${MUT_DIR:-/tmp/hetero-infer-mut}
cr=${COSMIC_RAY:-cosmic-ray}
name=$(basename "$module" .py)

rm -rf "$work"
mkdir -p "$work"
# tracked and untracked-but-not-ignored files, as the working tree has them now
if [ -n "${MUT_REV:-}" ]; then
  git -C "$repo" archive "$MUT_REV" | tar -x -C "$work"
  for path in ${MUT_ADD:-}; do (cd "$repo" && cp --parents -t "$work" "$path"); done
else
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$work" 2>/dev/null || true)
fi
# The installed package maps hetero_infer.worker -> worker/ etc. (editable install); put a
# package on PYTHONPATH that maps the same names onto the scratch copy instead, so the
# mutated files are the ones imported. PYTHONPATH is searched before the editable finder;
# it names a folder holding only the package, since the copy's operator/ would shadow the
# standard library's `operator`.
for sub in worker kernels operator; do ln -s "../$sub" "$work/hetero_infer/$sub"; done
mkdir "$work/_shim" && ln -s ../hetero_infer "$work/_shim/hetero_infer"

cat > "$work/mutation.toml" <<TOML
[cosmic-ray]
module-path = "$module"
timeout = ${MUT_TIMEOUT:-60}
excluded-modules = []
# no plugins autoloaded (schemathesis, kopf... cost seconds per mutant); -x: stop at the first failure
test-command = "env PYTHONPATH=$work/_shim:$work/mutation PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -x -q -p no:cacheprovider -p hypothesis -p noshrink -p pytest_asyncio.plugin -p pytest_timeout $extra $tests"

[cosmic-ray.distributor]
name = "local"
TOML

cd "$work"
# the unmutated baseline must pass, or every mutant would count as killed
env PYTHONPATH="$work/_shim:$work/mutation" PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -x -q -p no:cacheprovider \
  -p hypothesis -p noshrink -p pytest_asyncio.plugin -p pytest_timeout $extra $tests
"$cr" init mutation.toml "$name.sqlite"
cr-filter-operators "$name.sqlite" "$repo/mutation/operators.toml"
if [ -n "${MUT_LINES:-}" ]; then python "$repo/mutation/only_lines.py" "$name.sqlite" "$MUT_LINES"; fi
if [ -n "${MUT_EARLIER:-}" ]; then python "$repo/mutation/only_survivors.py" "$MUT_EARLIER" "$name.sqlite"; fi
"$cr" exec mutation.toml "$name.sqlite"
python "$repo/mutation/rate.py" "$name.sqlite"

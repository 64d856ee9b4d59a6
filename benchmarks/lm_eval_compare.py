"""lm-evaluation-harness against the server, beside its own transformers backend: compares the per-request
loglikelihoods (and is-greedy flags) of two `lm_eval run --log_samples` outputs of the same task, and prints a
table. The task (`benchmarks/lm_eval_task/`, run from the repository root) is a local multiple-choice file, so
no dataset download is needed. docs/api.md ("Checked with lm-evaluation-harness") has the commands.

    python benchmarks/lm_eval_compare.py OURS_OUTPUT_DIR HF_OUTPUT_DIR
"""

from __future__ import annotations

import argparse
import glob
import json
import sys


def samples(output_dir: str) -> dict[int, dict]:
    paths = glob.glob(f"{output_dir}/**/samples_*.jsonl", recursive=True)
    if len(paths) != 1:
        raise SystemExit(f"{output_dir}: expected one samples_*.jsonl, found {len(paths)}")
    with open(paths[0]) as f:
        return {d["doc_id"]: d for d in map(json.loads, f)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ours")
    parser.add_argument("hf")
    args = parser.parse_args(argv)
    ours, hf = samples(args.ours), samples(args.hf)
    if ours.keys() != hf.keys():
        raise SystemExit("the two runs scored different documents")
    diffs, greedy_same, acc = [], 0, {"ours": 0.0, "hf": 0.0}
    for doc_id, ours_doc in ours.items():
        hf_doc = hf[doc_id]
        for (a_lp, a_greedy), (b_lp, b_greedy) in zip(ours_doc["filtered_resps"], hf_doc["filtered_resps"], strict=True):
            diffs.append(abs(float(a_lp) - float(b_lp)))
            greedy_same += a_greedy == b_greedy
        acc["ours"] += ours_doc["acc"]
        acc["hf"] += hf_doc["acc"]
    print(f"\n{len(ours)} documents, {len(diffs)} loglikelihood requests\n")
    print("| | value |")
    print("|---|---:|")
    print(f"| max abs loglikelihood difference | {max(diffs):.2e} |")
    print(f"| mean abs loglikelihood difference | {sum(diffs) / len(diffs):.2e} |")
    print(f"| is-greedy flags equal | {greedy_same}/{len(diffs)} |")
    print(f"| acc (server) | {acc['ours'] / len(ours):.4f} |")
    print(f"| acc (transformers) | {acc['hf'] / len(hf):.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

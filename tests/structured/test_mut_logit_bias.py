"""A case mutation testing of the sampler's logit_bias (docs/testing.md, round 5) found unchecked: ids outside
the logits row (-1, the row width; the request check refuses them, but the model's logits can be narrower than
a tokenizer's id range) are ignored and never land in a neighbouring row of the flat scatter."""

from __future__ import annotations

import torch

from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.runner.sampler import SamplingRow, process_logits

VOCAB = 50


def test_ids_outside_the_row_never_reach_a_neighbouring_row():
    torch.manual_seed(1)
    logits = torch.randn(3, VOCAB)
    rows = [SamplingRow(SamplingParams(), [1], [], None),
            SamplingRow(SamplingParams(logit_bias={-1: 50.0, VOCAB: 50.0, 4: 1.5}), [1], [], None),
            SamplingRow(SamplingParams(), [1], [], None)]
    x = process_logits(logits, rows)
    expected = logits.clone()
    expected[1, 4] += 1.5
    assert torch.equal(x, expected)

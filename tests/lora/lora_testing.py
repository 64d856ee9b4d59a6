"""Helpers of the LoRA tests: random, non-zero PEFT adapters made by peft itself (`get_peft_model`, lora_B drawn at
random, `save_pretrained`) for the tiny random-weight models of tests/quant/quant_testing.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def other_base(folder: Path, dst: Path) -> Path:
    """A copy of model folder `folder` whose config.json is another base's (hidden size 96): what an executor that
    reads no weights (the mock) checks adapters against."""
    shutil.copytree(folder, dst)
    config = json.loads((dst / "config.json").read_text())
    config["hidden_size"] = 96
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def save_adapter(base, folder: Path, *, r: int, targets: list[str], alpha: float = 16.0, rslora: bool = False,
                 seed: int = 0, std: float = 0.2) -> Path:
    """A PEFT LoRA adapter of `base` with random A and B (peft leaves B zero: an adapter that changes nothing),
    saved by peft to `folder`."""
    import copy

    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, use_rslora=rslora,
                        task_type="CAUSAL_LM")
    peft_model = get_peft_model(copy.deepcopy(base), config)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.normal_(0.0, std)
    peft_model.save_pretrained(folder)
    return folder


def edit_adapter_config(folder: Path, **changes) -> None:
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def peft_reference(base, adapter: Path):
    """transformers + peft: the reference model of `adapter` on `base` (float32, eval)."""
    import copy

    from peft import PeftModel

    return PeftModel.from_pretrained(copy.deepcopy(base), str(adapter)).eval()

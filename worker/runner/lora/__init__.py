"""LoRA adapters in the runner: reading and checking PEFT folders (`adapter`), the device slots (`slots`)."""

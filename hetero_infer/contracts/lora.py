"""LoRA adapters: what names one (`LoRARequest`, vLLM's name and fields) and what a bad one fails with
(`LoRAAdapterError`). Dependency-free: the server, the router and the engine process all pass these around.

An adapter is a PEFT folder (`adapter_config.json` + `adapter_model.safetensors`) at `lora_path`. The engine keys
it by `lora_name` (requests, the prefix cache's block hashes, the device slots); `lora_int_id` is vLLM's numeric id,
kept for its users (and reported in KV events). `base_model_name`, when given, must be the served model's name.
"""

from __future__ import annotations

from dataclasses import dataclass


class LoRAAdapterError(ValueError):
    """An adapter the engine cannot load or serve (an HTTP 400): the message says what is wrong with it. Raised
    before anything changed: the adapter is not loaded, no request was queued."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple:  # crosses the engine process's pipe
        return type(self), (self.message,)


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise LoRAAdapterError("a LoRA adapter needs a non-empty lora_name")
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise LoRAAdapterError(f"LoRA adapter {self.lora_name!r}: lora_int_id must be an integer >= 1 "
                                   f"(got {self.lora_int_id!r})")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise LoRAAdapterError(f"LoRA adapter {self.lora_name!r}: lora_path must name its folder")

    # vLLM's accessors
    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

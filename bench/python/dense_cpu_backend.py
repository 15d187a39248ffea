"""A dense weight-transfer backend for vLLM's CPU engine, the reference of
`bench_engine.py`: what vLLM's own checkpoint-format backends (`ipc`,
`nccl`) do, with the tensors handed over in the process instead of through
CUDA IPC handles or an NCCL broadcast (every built-in backend is CUDA-only).

`start_weight_update` puts the whole model under vLLM's layerwise reload,
`update_weights` takes `{"names": [...], "tensors": [...]}` (canonical,
checkpoint-layout tensors) and feeds them to the model's `load_weights`,
`finish_weight_update` finalises the reload (each layer materialised,
`process_weights_after_loading` run, the result copied into the kernel
tensors). The base class's `update_weights` synchronises an accelerator,
which raises without one; this one does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.weight_transfer.base import (WeightTransferEngine, WeightTransferInitInfo,
                                                   WeightTransferUpdateInfo)

NAME = "dense_cpu"


@dataclass
class DenseInitInfo(WeightTransferInitInfo):
    pass


@dataclass
class DenseUpdateInfo(WeightTransferUpdateInfo):
    names: list = field(default_factory=list)
    tensors: list = field(default_factory=list)


class DenseCpuEngine(WeightTransferEngine):
    init_info_cls = DenseInitInfo
    update_info_cls = DenseUpdateInfo
    supports_draft_weight_update = False

    def init_transfer_engine(self, init_info) -> None:
        pass

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload
        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info) -> None:
        if len(update_info.names) != len(update_info.tensors):
            raise ValueError("dense_cpu: names and tensors differ in length")
        self.model.load_weights(list(zip(update_info.names, update_info.tensors)))

    def update_weights(self, update_info) -> None:
        self.receive_weights(self.parse_update_info(update_info))

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload
        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        pass


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    try:
        WeightTransferEngineFactory.register_engine(NAME, DenseCpuEngine)
    except ValueError:
        pass  # registered before


def update(llm, names, tensors) -> None:
    """One dense weight update of `llm` (started with this backend) through
    vLLM's own driver calls: every canonical tensor, in `names` order, then
    the prefix cache reset (its KV blocks hold the old weights' values)."""
    llm.collective_rpc("start_weight_update")
    llm.collective_rpc("update_weights", args=({"names": list(names), "tensors": list(tensors)},))
    llm.collective_rpc("finish_weight_update")
    llm.reset_prefix_cache()

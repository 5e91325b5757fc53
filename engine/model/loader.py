"""Loads any Hugging Face causal LM with start-up errors that say what to do."""
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from contract import EngineConfig
from contract.memory import give_back_freed

from ..kernels.native import kv_half_ready
from ..kernels.table import report as kernel_report
from . import gguf_native, huge_pages, int4_cache, quantize_on_load, shared_weights
from . import lora as lora_layers
from .fp32 import install as fp32_layers
from .gguf import load_gguf
from .gguf_file import find_gguf
from .info import ModelInfo
from .int4 import quantize
from .paged_attention import attention_name
from .plan import Plan, plan

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
           "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    max_context: int
    eos_token_ids: frozenset[int]
    load_seconds: float = 0.0
    int4: bool = False  # its Linear layers are int4 (int4.py)
    parameters: int = 0  # counted before quantization: int4 keeps its weights in buffers
    kv_dtype: torch.dtype = torch.float32  # the KV cache's (pick_kv_dtype)
    plan: Optional[Plan] = None  # how the engine's steps run it (plan.py); None: not planned (a test's model)
    quant: str = ""  # the GGML type its folder's weights were quantized to at load (quantize_on_load.py)
    lora: Optional[lora_layers.Lora] = None  # the LoRA adapters it serves (lora.py)

    @property
    def info(self) -> ModelInfo:
        dtype = self.quant or ("int4" if self.int4 else str(self.model.dtype).removeprefix("torch."))
        tensors = {id(t): t for t in (*self.model.parameters(), *self.model.buffers())}  # tied ones once
        return ModelInfo(str(self.device), dtype, self.max_context, self.load_seconds,
                         str(self.kv_dtype).removeprefix("torch."), str(self.model.config.model_type),
                         self.parameters, sum(t.nbytes for t in tensors.values()))


def pick_device(requested: str | None) -> torch.device:
    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(requested: str, device: torch.device) -> torch.dtype:
    """The dtype to load in; int4 loads in fp32, then `pick_int4` converts."""
    if requested == "int4":
        if device.type != "cpu":
            raise ValueError(f"dtype: int4 runs on CPU only, not {device.type}; use auto, bf16 or fp16 there")
        return torch.float32
    if requested != "auto":
        if requested not in _DTYPES:
            raise ValueError(f"dtype: unknown {requested!r}; choose auto, int4 or one of {sorted(_DTYPES)}")
        return _DTYPES[requested]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def pick_kv_dtype(requested: str, model_dtype: torch.dtype, int4: bool) -> torch.dtype:
    """The KV cache's dtype (EngineConfig.kv_cache_dtype): as asked; auto is fp16 for int4 weights
    where the C attention reads fp16 (F16C), as llama.cpp keeps its cache: half the memory, and
    decode's attention reads half the bytes. There each row's numbers are its own whatever the
    batch, so rounding its keys keeps batched == alone bit for bit; PyTorch's fp32 matmuls round
    a row by its batch, and fp16 would magnify that, so other models keep their own dtype (fp32 on
    CPU, bf16 or fp16 on GPU)."""
    if requested != "auto":
        return _DTYPES[requested]
    return torch.float16 if int4 and kv_half_ready() else model_dtype


def pick_int4(requested: str, device: torch.device, model: PreTrainedModel, source: str = "") -> bool:
    """int4 when asked for; and by default on CPU when the weights already are 4-bit in
    groups of 32 (a Q4_1 GGUF's, as the default model's): int4 then loses nothing. What a
    folder's (`source`) load found is kept for its next load (int4_cache.py)."""
    if requested == "int4":
        if not quantize(model):
            raise ValueError("dtype: int4 needs Linear layers whose input width is a multiple of 32, "
                             "and this model's are not (GPT-2's are Conv1D); use fp32 or bf16")
    elif not (requested == "auto" and device.type == "cpu" and int4_cache.quantize_exact(model, source)):
        return False
    return True


def use_paged_attention(model: PreTrainedModel, kv_dtype: torch.dtype) -> None:
    """Every attention layer reads and writes the engine's paged KV pool (paged_attention.py), and
    rounds its keys and values to the pool's dtype in a direct forward too (the implementation's
    name carries the dtype: `attention_name`)."""
    try:
        model.set_attn_implementation(attention_name(kv_dtype))
    except (ValueError, ImportError) as exc:
        raise RuntimeError(f"this model cannot use the engine's paged attention: {exc}") from exc


def pick_attention_backends(device: torch.device) -> None:
    """No cuDNN attention on CUDA: it builds a graph for every new shape (about 50 ms each
    on an H100, measured), and a decode step's key length is new at every step, so it made
    GPT-2 small decode at 60 ms a step instead of 9. Flash and memory-efficient SDPA remain."""
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def load_model(config: EngineConfig, on_tokenizer: Callable[[Any], None] = lambda tokenizer: None,
               decoding_from: Optional[str] = None) -> LoadedModel:
    """on_tokenizer: called with the tokenizer as soon as the load has it, before the weights.
    decoding_from: the folder of a kept GGUF tokenizer that another process encodes with, where
    this process only decodes until it asks (model/decoding_tokenizer.py)."""
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    device = pick_device(config.device)
    dtype = pick_dtype(config.dtype, device)
    pick_attention_backends(device)
    source = config.model
    started = time.perf_counter()
    gguf = find_gguf(source)
    blocks = gguf is not None and device.type == "cpu" and config.dtype in ("auto", "int4") and gguf_native.servable()
    quant = quantize_on_load.pick(config, source, device, gguf is not None)
    try:
        if blocks:
            assert gguf is not None
            log.info("%s is GGUF: its quantized weights kept as the file's blocks", source)
            tokenizer, model, parameters = gguf_native.load(*gguf, on_tokenizer, decoding_from)
        elif quant is not None:
            log.info("%s: its weights served as %s blocks (quant: %s)", source, quant, config.quant)
            tokenizer, model, parameters = quantize_on_load.load(source, quant, config.trust_remote_code, on_tokenizer)
            blocks = True
        else:
            tokenizer, model = _from_source(source, gguf, dtype, config.trust_remote_code, on_tokenizer)
    except (OSError, ValueError) as exc:
        hint = ("it is not a local folder; set LLM_MODEL to a folder with config.json and weights, "
                "a .gguf file, or a hub id on a machine that can reach the hub (`make model` "
                "builds the default)") if not os.path.exists(source) else "it is not a valid model"
        raise RuntimeError(f"could not load model {source!r}: {hint}. Cause: {exc}") from exc
    model.to(device).eval()
    if not blocks:
        parameters = model.num_parameters()
    int4 = blocks or pick_int4(config.dtype, device, model, source if gguf is None else "")
    if (blocks or not int4) and device.type == "cpu" and fp32_layers(model):  # batch-invariant fp32 products
        log.info("fp32 Linear layers run in dense_matmul.c")
    kv_dtype = pick_kv_dtype(config.kv_cache_dtype, model.dtype, int4)
    use_paged_attention(model, kv_dtype)
    adapters = _adapters(model, config, device)
    chosen = plan(model, device, kv_dtype, adapters is not None)
    if device.type == "cpu":
        if shared_weights.share(model, shared_weights.root()) is not None:  # the tensors moved: the C structs again
            chosen = plan(model, device, kv_dtype, adapters is not None)
        huge_pages.collapse_soon(model)  # while it serves: its copy off the start's path
        give_back_freed()  # the load's temporaries (1.9 GB resident after the 1.17B's load, 1.4 GB after this)
    log.info("%s", chosen)
    log.info("kernels: %s", "; ".join(kernel_report("int4" if int4 else "fp32", device.type)))
    return LoadedModel(model, tokenizer, device, _max_context(model, tokenizer),
                       _eos_ids(model, tokenizer, config), time.perf_counter() - started, int4, parameters,
                       kv_dtype, chosen, quant or "", adapters)


def _adapters(model: PreTrainedModel, config: EngineConfig, device: torch.device) -> Optional[lora_layers.Lora]:
    """The `lora` adapters put beside the model's layers (None: none); a RuntimeError naming the
    adapter for one that cannot be served."""
    sources = config.adapters()
    if not sources:
        return None
    if device.type != "cpu":
        raise RuntimeError(f"lora: adapters are served on CPU only here, not {device.type}")
    try:
        attached = lora_layers.attach(model, sources)
    except ValueError as exc:
        raise RuntimeError(str(exc)) from exc
    if attached is not None:
        log.info("LoRA adapters: %s", ", ".join(f"{a.name} (rank {a.rank}, {len(a.layers)} layers)"
                                              for a in attached.adapters))
    return attached


def _from_source(source: str, gguf: Optional[tuple[str, str]], dtype: torch.dtype, trust_remote_code: bool,
                 on_tokenizer: Callable[[Any], None]):
    """gguf: `find_gguf(source)`."""
    hf_logging.disable_progress_bar()  # a server's log is not a terminal
    if gguf is not None:
        log.info("%s is GGUF: dequantizing its weights to %s in memory", source, dtype)
        return load_gguf(*gguf, dtype)
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    on_tokenizer(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, trust_remote_code=trust_remote_code)
    return tokenizer, model


def _max_context(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> int:
    cfg = model.config.get_text_config()
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and 0 < limit < 10**7 else 2048


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
             config: EngineConfig) -> frozenset[int]:
    if config.eos_token_ids is not None:
        return frozenset(config.eos_token_ids)
    ids: set[int] = set()
    gen_eos = getattr(model.generation_config, "eos_token_id", None)
    if gen_eos is not None:
        ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)

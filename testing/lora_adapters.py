"""LoRA adapters for the tests, made with PEFT on a base model folder: random A and B (PEFT's own
start has B = 0, which adds nothing), and beside each, the base with it merged in by PEFT (the
reference that an adapter's answers are held to)."""
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

# two adapters of other ranks and targets; b is rsLoRA, scaled by alpha / sqrt(r)
ADAPTERS = {"a": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]},
            "b": {"r": 2, "lora_alpha": 4, "target_modules": ["k_proj", "o_proj", "gate_proj", "up_proj"],
                  "use_rslora": True}}


def make(base: str, root: Path) -> dict[str, Path]:
    """Each adapter's PEFT folder under `root`, by name; its merged model is `merged(folder)`."""
    folders = {}
    for seed, (name, options) in enumerate(ADAPTERS.items()):
        torch.manual_seed(seed + 1)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        get_peft_model(model, LoraConfig(init_lora_weights=False, **options)).save_pretrained(root / name)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        PeftModel.from_pretrained(model, root / name).merge_and_unload().save_pretrained(merged(root / name))
        AutoTokenizer.from_pretrained(base).save_pretrained(merged(root / name))
        folders[name] = root / name
    return folders


def one(base: str, folder: Path, rank: int = 4) -> Path:
    """A random adapter of `rank` on every attention projection of `base`, at `folder`."""
    torch.manual_seed(rank)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                        init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(folder)
    return folder


def merged(folder: Path) -> Path:
    """Where the base model with the adapter of `folder` merged in is."""
    return folder.parent / f"{folder.name}-merged"


def spec(folders: dict[str, Path]) -> str:
    """The `lora` option (LLM_LORA) that serves them."""
    return ",".join(f"{name}={path}" for name, path in folders.items())

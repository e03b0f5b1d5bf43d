"""Tiny random Llama-style and GPT-2-style models and a word-level tokenizer, built inside the tests."""

from __future__ import annotations

import copy

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from engine.models.loading import LoadedModel, ModelPair

EOS = 1


def tokenizer(vocab: int = 64, prefix: str = "t", eos: bool = True) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel({f"{prefix}{i}": i for i in range(vocab)}, unk_token=f"{prefix}0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=f"{prefix}{EOS}" if eos else None)


def llama(seed: int, layers: int = 2, vocab: int = 64, hidden: int = 32, sharpness: float = 1.0, eos: int | None = EOS):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=eos,
        tie_word_embeddings=False,
    )
    return _sharpen(LlamaForCausalLM(cfg), sharpness)


def gpt2(seed: int, layers: int = 2, vocab: int = 64, hidden: int = 32, sharpness: float = 1.0, eos: int | None = EOS):
    torch.manual_seed(seed)
    cfg = GPT2Config(
        vocab_size=vocab,
        n_embd=hidden,
        n_layer=layers,
        n_head=4,
        n_positions=256,
        eos_token_id=eos,
        bos_token_id=0,
        tie_word_embeddings=False,
    )
    return _sharpen(GPT2LMHeadModel(cfg), sharpness)


def _sharpen(model, sharpness: float):
    """Scale the output head so random models have peaked (not near-uniform) next-token distributions."""
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(sharpness)
    model.generation_config.eos_token_id = model.config.eos_token_id
    return model.eval()


def noisy_copy(model, seed: int, noise: float):
    """A draft that agrees with the target often but not always: the target's weights plus Gaussian noise."""
    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise * p.std().clamp(min=1e-3))
    return draft.eval()


def pair(target, draft, tok=None) -> ModelPair:
    tok = tok or tokenizer(target.config.vocab_size)
    return ModelPair(
        LoadedModel("target", "memory", target, tok),
        LoadedModel("draft", "memory", draft, tok),
        torch.device("cpu"),
        torch.float32,
        len(tok),
    )

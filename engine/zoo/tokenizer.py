"""Train the demo models' shared byte-level BPE tokenizer.

    python -m engine.zoo.tokenizer [--out checkpoints/tokenizer] [--vocab-size 4096]

Byte-level: every string (Chinese, emoji, any bytes of UTF-8) encodes and decodes back exactly.
`<|endoftext|>` (id 0) is bos, eos and pad. Deterministic for a given corpus.

demo-draft-othervocab has its own (OTHER_VOCAB): OTHER_VOCAB_SIZE tokens trained on every other document of the
corpus (`other_documents`), so its vocabulary, merges and ids differ from the shared one's: a draft with another
vocabulary, drafting over the intersection (engine/models/vocab_bridge.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from engine.zoo.corpus import EOT, documents, text_iterator

VOCAB_SIZE = 4096
DEFAULT_OUT = Path("checkpoints") / "tokenizer"
OTHER_VOCAB = "tokenizer-othervocab"  # the checkpoints/ folder of demo-draft-othervocab's tokenizer
OTHER_VOCAB_SIZE = 2048


def other_documents() -> list[tuple[str, str]]:
    """The documents demo-draft-othervocab's tokenizer is trained on: every other one of the corpus."""
    return documents()[1::2]


def train_tokenizer(vocab_size: int = VOCAB_SIZE, docs=None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    docs = documents() if docs is None else docs
    tok.train_from_iterator(text_iterator(docs), trainer=trainer, length=len(docs))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOT,
        eos_token=EOT,
        pad_token=EOT,
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
    return fast


def load_or_train(out: Path = DEFAULT_OUT, vocab_size: int = VOCAB_SIZE, docs=None):
    from transformers import PreTrainedTokenizerFast

    if (out / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(out))
    fast = train_tokenizer(vocab_size, docs)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return fast


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = ap.parse_args(argv)
    fast = train_tokenizer(args.vocab_size)
    args.out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(args.out))
    print(f"tokenizer: {len(fast)} tokens -> {args.out}")


if __name__ == "__main__":
    main()

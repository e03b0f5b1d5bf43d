"""`python -m engine.zoo train ...` / `python -m engine.zoo tokenizer ...` (same as the modules themselves)."""

import sys

USAGE = "usage: python -m engine.zoo {train,tokenizer} [options]   (see --help of each)"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("train", "tokenizer"):
        print(USAGE, file=sys.stderr)
        return 2
    if argv[0] == "train":
        from engine.zoo.train import main as run
    else:
        from engine.zoo.tokenizer import main as run
    run(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`draftlab convert-head SRC --to sglang|speculators --out DIR [--overwrite] [--verifier MODEL]`: an EAGLE-3 head
rewritten in the other engine's layout (engine/models/eagle3.py convert_head; the layouts and their aux-id conventions:
engine/config/head_format.py). vLLM serves the speculators layout, SGLang its own, whose aux ids are one lower."""

from __future__ import annotations

from app.commands.common import fail
from engine.config.head_format import LAYOUTS
from engine.errors import DraftLabError

NAME = "convert-head"


def add_parser(sub):
    p = sub.add_parser(
        NAME,
        help="rewrite an EAGLE-3 head in SGLang's layout (or back to vLLM's speculators layout)",
        description="Write the EAGLE-3 head in SRC (a speculators directory, as vLLM serves and `draftlab "
        "train-head` writes, or SGLang's / SpecForge's layout) in the other layout: SGLang's config "
        "(architectures LlamaForCausalLMEagle3, eagle_config.eagle_aux_hidden_state_layer_ids ONE LOWER: "
        "SGLang's id j reads the output of decoder layer j, vLLM's i the input of layer i) and "
        "`midlayer.*` weights, or the reverse. Tensors are copied as they are. A head SGLang would "
        "compute differently (norm_before_residual, norm_before_fc) is refused.",
    )
    p.add_argument("src", metavar="SRC", help="the head directory to convert")
    p.add_argument("--to", required=True, choices=LAYOUTS, help="the layout to write")
    p.add_argument(
        "--out",
        required=True,
        help="directory to write (created if missing; an existing one must be empty unless --overwrite); "
        "for SGLang the deploy tab serves SRC/sglang",
    )
    p.add_argument("--overwrite", action="store_true", help="replace the head a non-empty --out holds")
    p.add_argument(
        "--verifier",
        default=None,
        metavar="MODEL",
        help="the target the head was trained for, where SRC names none (SGLang's layout has no field "
        "for it; the speculators layout needs one)",
    )
    return p


def run(args) -> int:
    """No database: bad input (a DraftLabError) is one `error:` line, exit 2."""
    try:
        return _convert(args)
    except DraftLabError as exc:
        return fail(str(exc))


def _convert(args) -> int:
    """Convert, print where and what changed; bad input raises DraftLabError."""
    from engine.models.eagle3 import convert_head

    notes = convert_head(args.src, args.out, args.to, overwrite=args.overwrite, verifier=args.verifier)
    print(f"wrote {args.out} ({args.to} layout)")
    for note in notes:
        print(f"  {note}")
    return 0

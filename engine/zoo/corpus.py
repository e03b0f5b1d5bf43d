"""The demo models' training corpus, assembled at training time from what every Python install has.

Sources, in a fixed order (so the corpus is byte-for-byte reproducible on the same Python version):
  1. the standard library's ``.py`` sources (``sysconfig.get_paths()["stdlib"]``), test packages and
     site-packages skipped, walked in sorted order;
  2. ``pydoc_data.topics`` (the text of ``help()`` topics), sorted by key;
  3. a small synthetic block of Chinese prose and of arithmetic/algebra text, generated from fixed templates
     with a fixed seed (no file of the held-out prompt sets is read).

Documents are joined with the ``<|endoftext|>`` token. ``held_out(doc_index)`` picks a deterministic ~1 % of
documents for a validation loss.
"""

from __future__ import annotations

import os
import random
import sysconfig
import zlib
from collections.abc import Iterator

EOT = "<|endoftext|>"
SEED = 1234

_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test", "idlelib"}


def stdlib_sources() -> Iterator[tuple[str, str]]:
    """(relative path, text) for every stdlib .py file, in sorted walk order."""
    root = sysconfig.get_paths()["stdlib"]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("test"))
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            try:
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
            except (UnicodeDecodeError, OSError):
                continue
            if text.strip():
                yield os.path.relpath(path, root), text


def pydoc_topics() -> Iterator[tuple[str, str]]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # pragma: no cover - every CPython ships it
        return
    for key in sorted(topics):
        yield f"pydoc:{key}", topics[key]


_ZH_SUBJECTS = ["我们", "这个程序", "老师", "学生们", "研究人员", "这座城市", "我的朋友", "工程师", "这本书", "模型"]
_ZH_VERBS = ["正在学习", "需要理解", "经常讨论", "认真分析", "慢慢改进", "详细记录", "重新设计", "仔细检查"]
_ZH_OBJECTS = [
    "数据结构",
    "历史文化",
    "自然语言",
    "计算机科学",
    "经济发展",
    "环境保护",
    "数学问题",
    "推理速度",
    "传统节日",
    "人工智能",
]
_ZH_TAILS = [
    "，并且取得了很好的效果。",
    "，因为这对未来非常重要。",
    "，但是仍然存在一些问题。",
    "。",
    "，这需要时间和耐心。",
    "，所以大家都很关心。",
    "，然后写了一份报告。",
    "吗？",
    "，结果比预想的更好。",
]
_ZH_FIXED = [
    "春天来了，公园里的花都开了，很多人带着孩子出去散步。",
    "中国有五千多年的历史，长江和黄河是两条最重要的河流。",
    "学习编程的时候，最好先写一些小程序，再慢慢解决复杂的问题。",
    "请问从北京到上海坐高铁需要多长时间？",
    "他每天早上六点起床，先跑步半个小时，然后吃早饭。",
    "这篇文章介绍了投机解码的基本原理：小模型先猜，大模型再验证。",
    "如果明天下雨，我们就在家里看书、喝茶、聊天。",
    "科学家们认为，保护环境是每个人的责任。",
]


def chinese_text(n_paragraphs: int = 400, seed: int = SEED) -> Iterator[tuple[str, str]]:
    rng = random.Random(seed)
    for i in range(n_paragraphs):
        sents = [rng.choice(_ZH_FIXED)] if rng.random() < 0.3 else []
        for _ in range(rng.randint(2, 6)):
            sents.append(
                rng.choice(_ZH_SUBJECTS) + rng.choice(_ZH_VERBS) + rng.choice(_ZH_OBJECTS) + rng.choice(_ZH_TAILS)
            )
        yield f"zh:{i}", "".join(sents)


def math_text(n_docs: int = 400, seed: int = SEED + 1) -> Iterator[tuple[str, str]]:
    rng = random.Random(seed)
    for i in range(n_docs):
        lines = []
        for _ in range(rng.randint(4, 10)):
            kind = rng.randrange(6)
            a, b, c = rng.randint(1, 999), rng.randint(1, 999), rng.randint(2, 12)
            if kind == 0:
                lines.append(f"{a} + {b} = {a + b}")
            elif kind == 1:
                lines.append(f"{a} * {c} = {a * c}")
            elif kind == 2:
                lines.append(f"{a} - {b} = {a - b}")
            elif kind == 3:
                lines.append(f"Solve {c}x + {a} = {c * b + a}: x = {b}")
            elif kind == 4:
                lines.append(f"{c}^2 = {c * c}, {c}^3 = {c**3}, sqrt({c * c}) = {c}")
            else:
                lines.append(f"{a} / {c} = {a / c:.4f}")
        yield f"math:{i}", "\n".join(lines) + "\n"


def documents() -> list[tuple[str, str]]:
    """All corpus documents, (name, text), in their fixed order."""
    docs = list(stdlib_sources()) + list(pydoc_topics()) + list(chinese_text()) + list(math_text())
    return docs


def held_out(name: str) -> bool:
    """Deterministic ~1 % validation split by document name."""
    return zlib.crc32(name.encode("utf-8")) % 100 == 0


def text_iterator(docs: list[tuple[str, str]] | None = None) -> Iterator[str]:
    for _, text in docs if docs is not None else documents():
        yield text

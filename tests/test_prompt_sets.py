"""Built-in prompt sets and the user prompt-file loader (engine/text/prompt_sets.py)."""

from __future__ import annotations

import re

import pytest

from engine.errors import DraftLabError
from engine.text.prompt_sets import PROMPT_SETS, SPLITS, builtin_path, held_out_split, list_prompt_sets, load_prompts

CJK = re.compile(r"[\u4e00-\u9fff]")


def test_names_match_spec():
    assert set(PROMPT_SETS) == {"code", "english", "chinese", "math", "mixed"}
    assert set(SPLITS) == {"tune", "validation"}
    assert len(list_prompt_sets()) == 12 and "chat:tune" in list_prompt_sets()  # + the chat set


@pytest.mark.parametrize(
    "spec", [f"{n}:{s}" for n in ("code", "english", "chinese", "math", "mixed") for s in ("tune", "validation")]
)
def test_every_builtin_split_loads_16_distinct_prompts(spec):
    prompts = load_prompts(spec)
    assert len(prompts) >= 16
    assert len(set(prompts)) == len(prompts)
    assert all(isinstance(p, str) and p.strip() for p in prompts)


def test_bare_name_is_tune_split():
    assert load_prompts("math") == load_prompts("math:tune")
    assert load_prompts("math") != load_prompts("math:validation")


@pytest.mark.parametrize("name", ["code", "english", "chinese", "math", "mixed"])
def test_validation_is_held_out(name):
    assert not set(load_prompts(f"{name}:tune")) & set(load_prompts(f"{name}:validation"))


def test_builtins_are_package_data():
    for name in PROMPT_SETS:
        for split in SPLITS:
            assert builtin_path(name, split).is_file()


def test_chinese_is_really_chinese():
    for split in SPLITS:
        prompts = load_prompts(f"chinese:{split}")
        assert all(CJK.search(p) for p in prompts)
        text = "".join(prompts)
        assert len(CJK.findall(text)) / len(text) > 0.6


def test_english_has_no_cjk():
    assert not any(CJK.search(p) for p in load_prompts("english") + load_prompts("english:validation"))


def test_math_is_dense_in_numbers():
    for split in SPLITS:
        prompts = load_prompts(f"math:{split}")
        assert all(re.search(r"\d", p) for p in prompts)
        assert sum(bool(re.search(r"[=+*/^-]", p)) for p in prompts) >= 0.9 * len(prompts)


def test_code_is_mostly_python_with_some_js_and_sql():
    for split in SPLITS:
        prompts = load_prompts(f"code:{split}")
        python = [p for p in prompts if re.search(r"^\s*(def |class |import |@|if |for |try:)|    def ", p, re.M)]
        js = [p for p in prompts if re.search(r"\bfunction\b|\bconst\b|\blet\b", p)]
        sql = [p for p in prompts if re.search(r"\bSELECT\b|\bCREATE TABLE\b", p)]
        assert len(python) > len(prompts) / 2
        assert js and sql


def test_mixed_switches_scripts():
    for split in SPLITS:
        prompts = load_prompts(f"mixed:{split}")
        both = [p for p in prompts if CJK.search(p) and re.search(r"[A-Za-z]{2,}", p)]
        assert len(both) >= 0.75 * len(prompts)


# ---- user files -------------------------------------------------------------------------------------------


def test_jsonl_csv_txt_files(tmp_path):
    j = tmp_path / "p.jsonl"
    j.write_text('{"prompt": "hello", "id": 1}\n\n{"prompt": "你好\\n世界"}\n', encoding="utf-8")
    assert load_prompts(str(j)) == ["hello", "你好\n世界"]
    c = tmp_path / "p.csv"
    c.write_text('id,prompt\n1,"a, b"\n2,"multi\nline"\n', encoding="utf-8")
    assert load_prompts(str(c)) == ["a, b", "multi\nline"]
    t = tmp_path / "p.txt"
    t.write_text("first\n\nsecond 第二\n", encoding="utf-8")
    assert load_prompts(str(t)) == ["first", "second 第二"]


def test_bom_and_crlf_are_accepted(tmp_path):
    t = tmp_path / "p.txt"
    t.write_bytes("\ufefffirst\r\nsecond\r\n".encode("utf-8"))
    assert load_prompts(str(t)) == ["first", "second"]


def _error(spec) -> str:
    with pytest.raises(DraftLabError) as info:
        load_prompts(spec)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("ext", [".jsonl", ".csv", ".txt"])
def test_empty_file(tmp_path, ext):
    f = tmp_path / f"empty{ext}"
    f.write_text("  \n\n", encoding="utf-8")
    msg = _error(str(f))
    assert str(f) in msg and "empty" in msg


def test_jsonl_missing_prompt_field_names_line(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "ok"}\n{"text": "no prompt here"}\n', encoding="utf-8")
    msg = _error(str(f))
    assert str(f) in msg and "line 2" in msg and "prompt" in msg and "text" in msg


def test_jsonl_invalid_json_names_line(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "ok"}\n\n{"prompt": "unterminated}\n', encoding="utf-8")
    msg = _error(str(f))
    assert str(f) in msg and "line 3" in msg and "invalid JSON" in msg


def test_jsonl_non_object_and_non_string(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('["a list"]\n', encoding="utf-8")
    assert "line 1" in _error(str(f))
    f.write_text('{"prompt": 42}\n', encoding="utf-8")
    assert "line 1" in _error(str(f)) and "string" in _error(str(f))


def test_csv_missing_prompt_column(tmp_path):
    f = tmp_path / "p.csv"
    f.write_text("id,text\n1,hello\n", encoding="utf-8")
    msg = _error(str(f))
    assert str(f) in msg and "line 1" in msg and '"prompt" column' in msg and "text" in msg


@pytest.mark.parametrize("ext", [".jsonl", ".csv", ".txt"])
def test_undecodable_bytes_name_the_line(tmp_path, ext):
    f = tmp_path / f"bad{ext}"
    head = {"jsonl": b'{"prompt": "ok"}\n', "csv": b"prompt\nok\n", "txt": b"ok\n"}[ext[1:]]
    f.write_bytes(head + b"also ok\n" + b"caf\xe9 latin-1\n")
    msg = _error(str(f))
    assert str(f) in msg and "undecodable" in msg and "UTF-8" in msg
    bad_line = head.count(b"\n") + 2
    assert f"line {bad_line}" in msg


def test_unknown_extension_and_missing_file(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("prompt: hi\n", encoding="utf-8")
    msg = _error(str(f))
    assert ".yaml" in msg and ".jsonl" in msg
    msg = _error(str(tmp_path / "nope.jsonl"))
    assert "no such" in msg and "nope.jsonl" in msg


def test_unknown_set_and_split_list_the_valid_ones():
    msg = _error("poetry")
    assert "poetry" in msg and all(n in msg for n in PROMPT_SETS)
    msg = _error("code:test")
    assert "code:tune" in msg and "code:validation" in msg
    _error("")


def test_union_of_sets_and_its_held_out_split(tmp_path):
    code, english = load_prompts("code:tune"), load_prompts("english:tune")
    assert load_prompts("code:tune+english:tune") == code + english
    assert load_prompts(" code + english ") == code + english  # bare names: their tune splits
    f = tmp_path / "extra.txt"
    f.write_text("one\ntwo\n")
    assert load_prompts(f"math:validation+{f}") == load_prompts("math:validation") + ["one", "two"]
    plus = tmp_path / "a+b.txt"  # an existing file whose name holds '+' is that file
    plus.write_text("x\n")
    assert load_prompts(str(plus)) == ["x"]
    assert held_out_split("code+english:tune") == ("code:validation+english:validation", "")
    held, note = held_out_split("code+english:validation")
    assert held == "code:validation+english:validation" and "not all held out" in note
    for bad in ("code++english", "code+", "code+nope"):
        with pytest.raises(DraftLabError) as err:
            load_prompts(bad)
        assert "\n" not in str(err.value)

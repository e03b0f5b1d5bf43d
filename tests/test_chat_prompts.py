"""Prompts as teams have them (engine/text/chat.py, engine/text/prompt_sets.py): OpenAI `messages` and ShareGPT
`conversations` JSONL, Parquet/Arrow exports, cut after the last user turn, rendered by the target tokenizer's chat
template (or a FILE, or none); the built-in chat set; every problem one line."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from engine.errors import DraftLabError
from engine.text.chat import Chat, render, resolve_option
from engine.text.prompt_sets import load_prompts
from engine.zoo import DEMO_TARGET, resolve
from tests import tiny_models as tm
from tests.meaning import missing

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture
def chat_tokenizer():
    tok = tm.tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def _jsonl(tmp_path, rows, name="chats.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return str(path)


OPENAI = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Sum 2+2"},
        {"role": "assistant", "content": "4"},
    ]
}
SHAREGPT = {"conversations": [{"from": "human", "value": "你好"}, {"from": "gpt", "value": "你好！"}]}


def test_openai_and_sharegpt_are_cut_after_the_last_user_turn(tmp_path, chat_tokenizer):
    prompts = load_prompts(_jsonl(tmp_path, [OPENAI, SHAREGPT, {"prompt": "plain text"}]))
    assert prompts[0] == Chat((("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "Sum 2+2")))
    assert prompts[1] == Chat((("user", "你好"),))
    assert prompts[2] == "plain text"
    text = render(prompts, chat_tokenizer)
    assert text == [
        "<system>Be brief.<user>Hi<assistant>Hello!<user>Sum 2+2<assistant>",
        "<user>你好<assistant>",
        "plain text",
    ]  # a plain prompt is never templated


def test_none_and_file_templates(tmp_path, chat_tokenizer):
    prompts = load_prompts(_jsonl(tmp_path, [OPENAI]))
    assert render(prompts, chat_tokenizer, "none") == ["Be brief.\n\nHi\n\nHello!\n\nSum 2+2"]
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    text = resolve_option(str(template))  # a FILE is stored and rendered as its text
    assert text == template.read_text()
    assert render(prompts, chat_tokenizer, text) == ["[Be brief.][Hi][Hello!][Sum 2+2]"]


def test_a_tokenizer_without_a_template_is_one_line(tmp_path):
    prompts = load_prompts(_jsonl(tmp_path, [OPENAI]))
    with pytest.raises(DraftLabError, match=r"conversations.*chat template.*--chat-template"):
        render(prompts, tm.tokenizer())
    assert render(["plain"], tm.tokenizer()) == ["plain"]  # plain prompts need no template
    with pytest.raises(DraftLabError, match="no such file"):
        resolve_option(str(tmp_path / "missing.jinja"))


@pytest.mark.parametrize(
    "row, message",
    [
        ({"messages": []}, "must be a non-empty list of turns"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, "has no user turn"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "unknown role 'wizard'"),
        ({"messages": [{"role": "user"}]}, 'every turn needs "role" and "content"'),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]}, "is not text"),
        ({"messages": [{"role": "user", "content": "a\x00b"}]}, "NUL"),
        ({"conversations": [{"from": "human", "value": 3}]}, "content must be text"),
    ],
)
def test_bad_conversations_are_one_line(tmp_path, row, message):
    with pytest.raises(DraftLabError, match=message) as info:
        load_prompts(_jsonl(tmp_path, [row]))
    assert "chats.jsonl: line 1" in str(info.value) and "\n" not in str(info.value)


def test_openai_content_parts_are_joined(tmp_path):
    row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    assert load_prompts(_jsonl(tmp_path, [row])) == [Chat((("user", "ab"),))]


def test_parquet_and_arrow_exports(tmp_path, chat_tokenizer):
    frame = pd.DataFrame({"conversations": [SHAREGPT["conversations"]], "id": [1]})
    frame.to_parquet(tmp_path / "export.parquet")
    assert load_prompts(str(tmp_path / "export.parquet")) == [Chat((("user", "你好"),))]
    pd.DataFrame({"messages": [OPENAI["messages"]]}).to_feather(tmp_path / "export.arrow")
    assert render(load_prompts(str(tmp_path / "export.arrow")), chat_tokenizer)[0].endswith("<user>Sum 2+2<assistant>")
    pd.DataFrame({"prompt": ["one", "two"]}).to_parquet(tmp_path / "plain.parquet")
    assert load_prompts(str(tmp_path / "plain.parquet")) == ["one", "two"]
    pd.DataFrame({"text": ["x"]}).to_parquet(tmp_path / "other.parquet")
    with pytest.raises(DraftLabError, match='no "prompt", "messages" or "conversations" column'):
        load_prompts(str(tmp_path / "other.parquet"))
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DraftLabError, match="cannot read it as parquet"):
        load_prompts(str(tmp_path / "broken.parquet"))


def test_builtin_chat_set_renders_with_the_demo_template():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve(DEMO_TARGET))
    for split in ("tune", "validation"):
        chats = load_prompts(f"chat:{split}")
        assert len(chats) >= 12 and all(isinstance(c, Chat) for c in chats)
        text = render(chats, tok)
        assert all(t.endswith("Assistant:") for t in text)
        assert any(t.count("User:") == 2 for t in text)  # a multi-turn conversation keeps its earlier turns
    assert not set(render(load_prompts("chat:tune"), tok)) & set(render(load_prompts("chat:validation"), tok))


# --- through the worker and the CLI: what is stored is what the models saw ---------------------------------------


def test_worker_freezes_rendered_conversations_and_a_missing_template_fails_the_experiment(tmp_path):
    from app.worker.worker import Worker
    from storage import open_store
    from storage.jobs.experiments import enqueue_experiment, load_experiment_prompts
    from storage.records import queries as q

    chats = _jsonl(tmp_path, [OPENAI, SHAREGPT])
    store = open_store(f"sqlite:///{tmp_path / 'chat.db'}")
    with_template = enqueue_experiment(
        store,
        name="chat",
        target="t",
        draft="d",
        prompts=chats,
        sampling={"max_new_tokens": 4},
        sweep_values=[2],
        device="cpu",
    )
    custom = enqueue_experiment(
        store,
        name="chat, own template",
        target="t-plain",
        draft="d",
        prompts=chats,
        sampling={"max_new_tokens": 4},
        sweep_values=[2],
        device="cpu",
        chat_template="{% for m in messages %}{{ m['content'] }}|{% endfor %}",
    )
    plain_tokenizer = enqueue_experiment(
        store,
        name="chat, no template",
        target="t-plain",
        draft="d",
        prompts=chats,
        sampling={"max_new_tokens": 4},
        sweep_values=[2],
        device="cpu",
    )

    def loader(target, draft, device, dtype, trust_remote_code, **kw):
        t = tm.llama(0)
        tok = tm.tokenizer()
        if target == "t":
            tok.chat_template = TEMPLATE
        return tm.pair(t, tm.noisy_copy(t, 1, 0.3), tok)

    with Worker(store, loader=loader, log=lambda message: None) as worker:
        worker.work(until_idle=True)
    with store.read() as conn:
        frozen = load_experiment_prompts(conn, with_template)
    assert frozen == ["<system>Be brief.<user>Hi<assistant>Hello!<user>Sum 2+2<assistant>", "<user>你好<assistant>"]
    runs = q.runs(store, with_template)
    assert set(runs["status"]) == {"done"}
    shown = q.per_prompt(store, int(runs[runs["kind"] == "speculative"]["run_id"].iloc[0]))
    assert shown["prompt"].tolist() == frozen  # the per-prompt table and round explorer show the rendered text
    with store.read() as conn:  # a stored template text renders in the worker, whatever the tokenizer has
        assert load_experiment_prompts(conn, custom) == ["Be brief.|Hi|Hello!|Sum 2+2|", "你好|"]
    failed = q.runs(store, plain_tokenizer)
    assert set(failed["status"]) == {"failed"}
    assert not missing(failed["error"].iloc[0], "chat template", "--chat-template"), failed["error"].iloc[0]


def test_cli_run_on_the_builtin_chat_set(tmp_path, capsys):
    from transformers import AutoTokenizer

    from app.cli import main
    from storage import open_store
    from storage.analysis import catalog
    from storage.jobs.experiments import load_experiment_prompts
    from storage.records import queries as q

    db = f"sqlite:///{tmp_path / 'cli.db'}"
    assert (
        main(
            [
                "run",
                "--target",
                "demo-target",
                "--draft",
                "demo-draft",
                "--prompts",
                "chat:validation",
                "--k",
                "2",
                "--max-new-tokens",
                "4",
                "--repeats",
                "1",
                "--db",
                db,
            ]
        )
        == 0
    )
    store = open_store(db)
    eid = int(catalog.experiments(store)["experiment_id"].iloc[0])
    with store.read() as conn:
        frozen = load_experiment_prompts(conn, eid)
    tok = AutoTokenizer.from_pretrained(resolve(DEMO_TARGET))
    assert frozen == render(load_prompts("chat:validation"), tok)
    assert q.experiment(store, eid)["chat_template"] == "auto"
    capsys.readouterr()
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }} {% endfor %}=>")
    assert (
        main(
            [
                "run",
                "--target",
                "demo-target",
                "--draft",
                "demo-draft",
                "--prompts",
                "chat:validation",
                "--k",
                "2",
                "--max-new-tokens",
                "16",
                "--repeats",
                "2",
                "--chat-template",
                str(template),
                "--db",
                db,
            ]
        )
        == 0
    )
    second = int(catalog.experiments(store)["experiment_id"].max())
    assert q.experiment(store, second)["chat_template"] == template.read_text()  # the text, not the path
    with store.read() as conn:
        assert all(p.endswith("=>") for p in load_experiment_prompts(conn, second))
    assert (
        main(
            [
                "run",
                "--target",
                "demo-target",
                "--draft",
                "demo-draft",
                "--prompts",
                "chat:validation",
                "--k",
                "2",
                "--chat-template",
                str(tmp_path / "nope.jinja"),
                "--db",
                db,
            ]
        )
        == 2
    )
    assert "--chat-template" in capsys.readouterr().err and len(catalog.experiments(store)) == 2


def test_cli_distill_takes_conversations(model_dirs, tmp_path, capsys):
    """A chat JSONL (as captured from production) is a distillation set: refused in one line without a template,
    trained on with --chat-template none."""
    from app.cli import main

    chats = _jsonl(
        tmp_path, [{"messages": [{"role": "user", "content": f"t{i} t{i + 1} t{i + 2}"}]} for i in range(3, 9)]
    )
    argv = [
        "distill",
        "--target",
        model_dirs["target"],
        "--draft",
        model_dirs["draft"],
        "--prompts",
        chats,
        "--steps",
        "1",
        "--max-new-tokens",
        "4",
        "--batch-size",
        "2",
    ]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 2
    assert "has no chat template" in capsys.readouterr().err
    assert main([*argv, "--out", str(tmp_path / "b"), "--chat-template", "none"]) == 0, capsys.readouterr().err
    assert (tmp_path / "b" / "config.json").is_file()


def test_dashboard_uploads_render_through_the_pair_checks_tokenizer(model_dirs, tmp_path):
    """The New-experiment and validation uploads freeze conversations as text (pages/pair_check.render_prompts):
    the tokenizer's template (auto), the experiment's own (none or a template's text); plain prompts untouched."""
    from pages.widgets.pair_check import render_prompts

    prompts = load_prompts(_jsonl(tmp_path, [OPENAI, {"prompt": "plain"}]))
    with pytest.raises(DraftLabError, match=r"uploaded prompts.*conversations.*chat template"):
        render_prompts(model_dirs["target"], prompts)
    assert render_prompts(model_dirs["target"], prompts, "none") == ["Be brief.\n\nHi\n\nHello!\n\nSum 2+2", "plain"]
    assert render_prompts(model_dirs["target"], prompts, "{{ messages[-1]['content'] }}!") == ["Sum 2+2!", "plain"]
    assert render_prompts(model_dirs["target"], ["a", "b"]) == ["a", "b"]


def test_cli_validate_holds_out_conversations_rendered_like_the_tuned_ones(tmp_path, capsys):
    """Tuned on chat:tune, `draftlab validate` reruns the chosen run on chat:validation, its conversations rendered
    with the tuned experiment's chat template (here a FILE's text, stored on the experiment)."""
    from app.cli import main
    from storage import open_store
    from storage.analysis import catalog
    from storage.jobs.experiments import load_experiment_prompts
    from storage.records import queries as q

    db = f"sqlite:///{tmp_path / 'v.db'}"
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}=>")
    assert (
        main(
            [
                "run",
                "--target",
                "demo-target",
                "--draft",
                "demo-draft",
                "--prompts",
                "chat:tune",
                "--k",
                "2",
                "--max-new-tokens",
                "16",
                "--repeats",
                "2",
                "--chat-template",
                str(template),
                "--db",
                db,
            ]
        )
        == 0
    )
    assert main(["validate", "1", "--db", db]) == 0, capsys.readouterr().err
    store = open_store(db)
    vid = int(catalog.experiments(store)["experiment_id"].max())
    assert q.experiment(store, vid)["prompts"] == "chat:validation"
    with store.read() as conn:
        frozen = load_experiment_prompts(conn, vid)
    assert frozen == [c.plain().replace("\n\n", "\n") + "\n=>" for c in load_prompts("chat:validation")]

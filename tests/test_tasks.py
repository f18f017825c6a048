"""refexp.tasks: rewards, generated arithmetic data and its cache, tokenizers, local-file loaders
(GSM8K, preference pairs), build_task, and the batching helpers. Files are written to tmp_path;
nothing is downloaded."""

from __future__ import annotations

import json
import os
import re

import datasets
import pytest
import torch
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from refexp.config import ConfigError, TaskConfig
from refexp.tasks import Task, arithmetic, build_task, task_fingerprint
from refexp.tasks.arithmetic import generate_arithmetic, load_arithmetic
from refexp.tasks.batching import encode_prompts, pack_sequences
from refexp.tasks.chat import render_chat
from refexp.tasks.gsm8k import load_gsm8k
from refexp.tasks.preference import load_preference
from refexp.tasks.rewards import exact_match_reward, gsm8k_reward, parse_integer
from refexp.tasks.tokenizer import TextTokenizer, build_char_tokenizer

MALFORMED = ["", " ", "12a", "--3", "1e5", "__import__('os')", "1_000", "+5", "0x10", "1.5", "١٢", "3 4",
             "<eos>", "9" * 5000, "-"]


def _write_jsonl(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return str(path)


def _small(**overrides) -> TaskConfig:
    return TaskConfig(**{"num_train": 300, "num_eval": 50, **overrides})


# ---------------------------------------------------------------- rewards
def test_parse_integer_accepts_integers_with_leading_zeros_and_rejects_everything_else():
    assert parse_integer("42") == 42
    assert parse_integer("0359") == 359
    assert parse_integer(" 007\n") == 7
    assert parse_integer("-3") == -3
    for text in MALFORMED + [None, 12, b"12"]:
        assert parse_integer(text) is None, text


def test_exact_match_reward_is_numeric_and_never_raises():
    assert exact_match_reward("0359", "359") == 1.0
    assert exact_match_reward("359", "0359") == 1.0
    assert exact_match_reward("0358", "359") == 0.0
    for text in MALFORMED:
        assert exact_match_reward(text, "5") == 0.0, text


def test_gsm8k_reward_reads_the_marked_or_last_number():
    assert gsm8k_reward("so she has 1234 apples.\n#### 1,234", "1234") == 1.0
    assert gsm8k_reward("#### 1234", "Natalia sold ...\n#### 1,234") == 1.0  # reference as a solution
    assert gsm8k_reward("She pays 5, then 7, so 72.", "72") == 1.0  # no marker: the last number
    assert gsm8k_reward("#### 72.0 dollars", "72") == 1.0
    assert gsm8k_reward("#### 72 but 73", "72") == 1.0  # the number right after the last ####
    assert gsm8k_reward("#### 7 ... #### 73", "72") == 0.0
    assert gsm8k_reward("72 #### none", "72") == 0.0  # a marker with no number after it
    assert gsm8k_reward("#### -5", "-5") == 1.0
    assert gsm8k_reward("1,2,3", "123") == 0.0  # not a thousands-grouped number
    for text in MALFORMED + ["####", "#### 1e5", "__import__('os').system('true')"]:
        assert gsm8k_reward(text, "9") == 0.0, text


# ---------------------------------------------------------------- arithmetic data
def test_default_arithmetic_format_is_zero_padded_msd_first():
    splits = generate_arithmetic(_small())
    assert set(splits) == {"train", "test"}
    assert splits["train"].column_names == ["prompt", "completion", "answer", "solution"]
    assert (len(splits["train"]), len(splits["test"])) == (300, 50)
    seen = set()
    for row in splits["train"]:  # the default skills: sums (4 digits) and non-negative differences (3 digits)
        m = re.fullmatch(r"(\d{3})([+-])(\d{3})=", row["prompt"])
        assert m, row
        seen.add(m[2])
        result = int(m[1]) + int(m[3]) if m[2] == "+" else int(m[1]) - int(m[3])
        width = 4 if m[2] == "+" else 3
        assert result >= 0 and row["completion"] == f"{result:0{width}d}" and row["answer"] == str(result)
    assert seen == {"+", "-"}


def test_subtraction_is_non_negative_and_product_is_twice_as_wide():
    splits = generate_arithmetic(_small(digits=2, ops=["-", "*"], rl_ops=["-"], num_train=400))
    ops = {"-": 0, "*": 0}
    for row in splits["train"]:
        a, op, b = re.fullmatch(r"(\d\d)([-*])(\d\d)=", row["prompt"]).groups()
        ops[op] += 1
        a, b = int(a), int(b)
        if op == "-":
            assert a >= b and row["completion"] == f"{a - b:02d}"
        else:
            assert row["completion"] == f"{a * b:04d}"
    assert ops == {"-": 200, "*": 200}


def test_arithmetic_is_deterministic_disjoint_and_seeded():
    cfg = _small(ops=["+", "-"])
    a, b = generate_arithmetic(cfg), generate_arithmetic(cfg)
    assert a["train"].to_dict() == b["train"].to_dict() and a["test"].to_dict() == b["test"].to_dict()
    assert not set(a["train"]["prompt"]) & set(a["test"]["prompt"])
    assert len(set(a["train"]["prompt"])) == len(a["train"])  # no repeats either
    other = generate_arithmetic(_small(ops=["+", "-"], data_seed=cfg.data_seed + 1))
    assert other["train"]["prompt"] != a["train"]["prompt"]
    assert other["test"]["prompt"] != a["test"]["prompt"]
    # The held-out set does not move when only num_train changes.
    assert generate_arithmetic(_small(ops=["+", "-"], num_train=100))["test"].to_dict() == a["test"].to_dict()


def test_arithmetic_uses_the_whole_space_when_asked_and_refuses_more():
    splits = generate_arithmetic(TaskConfig(digits=1, ops=["-"], rl_ops=["-"], num_train=50, num_eval=5))
    assert len(set(splits["train"]["prompt"]) | set(splits["test"]["prompt"])) == 55  # all a>=b pairs
    with pytest.raises(ConfigError, match=r"task.num_train=51 \+ task.num_eval=5.*only 55 distinct"):
        generate_arithmetic(TaskConfig(digits=1, ops=["-"], rl_ops=["-"], num_train=51, num_eval=5))


def test_arithmetic_cache_is_reused_and_survives_a_lost_race(tmp_path, monkeypatch):
    cfg = _small()
    calls = []
    real = arithmetic.generate_arithmetic

    def generate_while_another_process_wins(c):
        calls.append(c)
        out = real(c)
        if len(calls) == 1:  # a concurrent process finishes first and renames its copy into place
            load_arithmetic(c, str(tmp_path))
        return out

    monkeypatch.setattr(arithmetic, "generate_arithmetic", generate_while_another_process_wins)
    first = load_arithmetic(cfg, str(tmp_path))
    assert len(calls) == 2  # ours lost the rename and loaded the winner's copy
    assert [p for p in os.listdir(tmp_path)] == [f"arithmetic-{arithmetic.arithmetic_fingerprint(cfg)}"]
    again = load_arithmetic(cfg, str(tmp_path))
    assert len(calls) == 2  # reused, not regenerated
    assert again["train"].to_dict() == first["train"].to_dict() == real(cfg)["train"].to_dict()


# ---------------------------------------------------------------- tokenizers
def test_char_tokenizer_round_trip_and_specials(tmp_path):
    tok = build_char_tokenizer()
    assert tok.vocab_size == 17 and (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, 2)
    ids = tok.encode("042+317=0359")
    assert len(ids) == 12 and tok.decode(ids) == "042+317=0359"
    assert tok.encode("1", add_bos=True) == [tok.bos_id] + tok.encode("1")
    # decode stops at the first eos, drops pad/bos and ids past the vocabulary
    assert tok.decode([tok.bos_id] + tok.encode("12") + [99, tok.eos_id] + tok.encode("3")) == "12"
    assert tok.decode(torch.tensor(tok.encode("7") + [tok.pad_id, tok.pad_id])) == "7"
    with pytest.raises(ValueError, match="cannot tokenize"):
        tok.encode("1 a")

    tok.save(str(tmp_path / "tok"))
    loaded = TextTokenizer.from_dir(str(tmp_path / "tok"))
    assert (loaded.pad_id, loaded.eos_id, loaded.bos_id, loaded.vocab_size) == (0, 1, 2, 17)
    assert loaded.encode("9*9=81") == tok.encode("9*9=81")


CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _hf_dir(path, *, chat_template=None, pad=None, special_map=None) -> str:
    """An HF-style tokenizer dir: a word-level tokenizer.json + tokenizer_config.json."""
    words = ["<unk>", "<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "hi", "hello", "bye", "\n"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens([AddedToken(t, special=True) for t in words[:6]])
    os.makedirs(path, exist_ok=True)
    backend.save(os.path.join(path, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
              "eos_token": {"__type": "AddedToken", "content": "</s>", "special": True}}  # serialized form
    if pad:
        config["pad_token"] = pad
    if chat_template:
        config["chat_template"] = chat_template
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    if special_map:
        with open(os.path.join(path, "special_tokens_map.json"), "w") as f:
            json.dump(special_map, f)
    return str(path)


def test_hf_tokenizer_dir_loading(tmp_path):
    tok = TextTokenizer.from_dir(_hf_dir(tmp_path / "a"))
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 2)  # pad falls back to eos
    assert tok.encode("hi hello") == [6, 7]  # no post-processor specials
    assert tok.decode([1, 6, 7, 2, 8]) == "hi hello"
    tok = TextTokenizer.from_dir(_hf_dir(tmp_path / "b", pad="<pad>", special_map={"eos_token": "<|assistant|>"}))
    assert (tok.pad_id, tok.eos_id) == (3, 5)  # special_tokens_map.json overrides tokenizer_config.json
    with pytest.raises(ConfigError, match=re.escape(str(tmp_path / "none")) + ".*tokenizer.json"):
        TextTokenizer.from_dir(str(tmp_path / "none"))
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ConfigError, match="empty.*has no tokenizer.json"):
        TextTokenizer.from_dir(str(tmp_path / "empty"))


def test_chat_template_renders_like_transformers(tmp_path):
    from transformers import AutoTokenizer

    path = _hf_dir(tmp_path / "chat", chat_template=CHAT_TEMPLATE)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    ours = TextTokenizer.from_dir(path)
    theirs = AutoTokenizer.from_pretrained(path)
    for msgs, gen in ((messages, False), (messages[:1], True)):
        assert render_chat(msgs, ours, add_generation_prompt=gen) == theirs.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=gen)
    assert render_chat(messages) == "user: hi\nassistant: hello\n"  # the fallback without a template
    # the char tokenizer's saved dir is loadable by transformers too
    build_char_tokenizer().save(str(tmp_path / "char"))
    assert AutoTokenizer.from_pretrained(str(tmp_path / "char")).encode("12+3=") == [4, 5, 13, 6, 16]


# ---------------------------------------------------------------- GSM8K files
GSM8K_ROWS = [
    {"question": "Natalia sold 48 clips. How many?", "answer": "48/2 = <<48/2=24>>24\n#### 72"},
    {"question": "A big one?", "answer": "It is big.\n#### 1,234"},
    {"question": "Below zero?", "answer": "#### -5"},
]


def test_gsm8k_loader_all_formats(tmp_path):
    path = _write_jsonl(tmp_path / "gsm.jsonl", GSM8K_ROWS)
    ds = load_gsm8k(path, cache_dir=str(tmp_path / "c"))
    assert ds.column_names == ["prompt", "completion", "answer"]
    assert ds[0]["prompt"] == "Question: Natalia sold 48 clips. How many?\nAnswer:"
    assert ds[0]["completion"] == " 48/2 = <<48/2=24>>24\n#### 72"
    assert ds["answer"] == ["72", "1234", "-5"]
    assert gsm8k_reward(" It is big.\n#### 1234", ds[1]["answer"]) == 1.0
    assert gsm8k_reward(ds[1]["completion"], ds[1]["answer"]) == 1.0
    assert gsm8k_reward("#### 1235", ds[1]["answer"]) == 0.0

    raw = datasets.Dataset.from_list(GSM8K_ROWS)
    with open(tmp_path / "gsm.json", "w") as f:
        json.dump(GSM8K_ROWS, f)
    raw.to_parquet(str(tmp_path / "gsm.parquet"))
    raw.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict(train=raw, test=raw).save_to_disk(str(tmp_path / "saved_dict"))
    for other in ("gsm.json", "gsm.parquet", "saved", "saved_dict/train"):
        assert load_gsm8k(str(tmp_path / other), cache_dir=str(tmp_path / "c")).to_dict() == ds.to_dict()
    with pytest.raises(ConfigError, match="several splits.*saved_dict/train"):
        load_gsm8k(str(tmp_path / "saved_dict"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_gsm8k(str(tmp_path / "missing.jsonl"))


@pytest.mark.parametrize("bad_row, expected", [
    ({"question": "", "answer": "#### 1"}, "question is ''"),
    ({"question": "Q?", "answer": "the answer is 4"}, "has no '####'"),
    ({"question": "Q?", "answer": "#### four"}, "is 'four'; expected a number"),
    ({"question": "Q?"}, "missing column 'answer'"),
])
def test_gsm8k_malformed_row_names_file_and_row(tmp_path, bad_row, expected):
    path = _write_jsonl(tmp_path / "bad.jsonl", [GSM8K_ROWS[0], bad_row])
    with pytest.raises(ConfigError, match=re.escape(path) + r": row 1: .*" + re.escape(expected)):
        load_gsm8k(path, cache_dir=str(tmp_path / "c"))


def test_gsm8k_missing_column_and_broken_files_name_file_and_row(tmp_path):
    path = _write_jsonl(tmp_path / "q.jsonl", [{"question": "Q?", "solution": "#### 1"}])
    with pytest.raises(ConfigError, match=re.escape(path) + r": row 0: missing column 'answer'"):
        load_gsm8k(path, cache_dir=str(tmp_path / "c"))
    path = _write_jsonl(tmp_path / "first.jsonl", [{"question": "Q?"}, GSM8K_ROWS[0]])  # null in row 0
    with pytest.raises(ConfigError, match=re.escape(path) + r": row 0: answer None has no '####'"):
        load_gsm8k(path, cache_dir=str(tmp_path / "c"))
    path = str(tmp_path / "array.json")
    with open(path, "w") as f:
        json.dump([GSM8K_ROWS[0], GSM8K_ROWS[1], {"question": "Q?", "answer": ["#### 1"]}], f)
    with pytest.raises(ConfigError, match=re.escape(path) + r": row 2: answer \['#### 1'\] has no"):
        load_gsm8k(path, cache_dir=str(tmp_path / "c"))
    path = str(tmp_path / "broken.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps(GSM8K_ROWS[0]) + "\n\n" + '{"question": "Q?", "answer": \n')
    with pytest.raises(ConfigError, match=re.escape(path) + r": row 1: not valid JSON"):
        load_gsm8k(path, cache_dir=str(tmp_path / "c"))


# ---------------------------------------------------------------- preference pairs
def _chat(*turns):
    return [{"role": r, "content": c} for r, c in zip(("user", "assistant") * 3, turns)]


def test_preference_text_format(tmp_path):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "1+1=", "chosen": "2", "rejected": "3", "id": 7}])
    ds = load_preference(path, cache_dir=str(tmp_path / "c"))
    assert ds.column_names == ["prompt", "chosen", "rejected"] and ds[0] == {"prompt": "1+1=", "chosen": "2",
                                                                           "rejected": "3"}


def test_preference_conversational_formats(tmp_path):
    implicit = _write_jsonl(tmp_path / "implicit.jsonl", [
        {"chosen": _chat("hi", "hello"), "rejected": _chat("hi", "bye")},
        {"chosen": _chat("hi", "hello", "hi", "bye"), "rejected": _chat("hi", "hello", "hi", "hi")},
    ])
    ds = load_preference(implicit, cache_dir=str(tmp_path / "c"))  # the role: content fallback
    assert ds[0] == {"prompt": "user: hi\nassistant: ", "chosen": "hello\n", "rejected": "bye\n"}
    assert ds[1]["prompt"] == "user: hi\nassistant: hello\nuser: hi\nassistant: "
    assert (ds[1]["chosen"], ds[1]["rejected"]) == ("bye\n", "hi\n")

    explicit = _write_jsonl(tmp_path / "explicit.jsonl", [
        {"prompt": _chat("hi"), "chosen": [{"role": "assistant", "content": "hello"}],
         "rejected": [{"role": "assistant", "content": "bye"}]},
    ])
    tok = TextTokenizer.from_dir(_hf_dir(tmp_path / "tok", chat_template=CHAT_TEMPLATE))
    row = load_preference(explicit, tok, cache_dir=str(tmp_path / "c"))[0]
    assert row == {"prompt": "<s><|user|>hi</s>\n<|assistant|>", "chosen": "hello</s>\n", "rejected": "bye</s>\n"}
    # the pieces concatenate to the template's rendering of the whole conversation
    assert row["prompt"] + row["chosen"] == render_chat(_chat("hi", "hello"), tok)


@pytest.mark.parametrize("bad_row, expected", [
    ({"prompt": "1+1=", "chosen": "2", "rejected": ""}, "rejected is ''"),
    ({"chosen": _chat("hi", "hello"), "rejected": _chat("bye", "hello")}, "do not share"),
    ({"chosen": _chat("hi"), "rejected": _chat("hi")}, "role 'user', not 'assistant'"),
    ({"chosen": _chat("hi", "hello"), "rejected": [{"role": "assistant"}]}, "rejected: message 0 is"),
    ({"chosen": _chat("hi", "hello"), "rejected": "bye"}, "chosen and rejected are list and str"),
])
def test_preference_malformed_row_names_file_and_row(tmp_path, bad_row, expected):
    good = {"prompt": "1+1=", "chosen": "2", "rejected": "3"} if isinstance(bad_row["chosen"], str) else \
        {"chosen": _chat("hi", "hello"), "rejected": _chat("hi", "bye")}
    path = _write_jsonl(tmp_path / "bad.jsonl", [good, good, bad_row])
    with pytest.raises(ConfigError, match=re.escape(path) + r": row 2: .*" + re.escape(expected)):
        load_preference(path, cache_dir=str(tmp_path / "c"))


# ---------------------------------------------------------------- build_task
def test_build_task_arithmetic(tmp_path):
    task = build_task(_small(ops=["+"]), str(tmp_path))  # one skill: every split serves SFT and RL alike
    assert isinstance(task, Task) and task.name == "arithmetic" and task.tokenizer.vocab_size == 17
    # 300 generated training problems, 2.5% of them carved off as validation
    assert (len(task.train), len(task.val), len(task.eval), task.max_new_tokens) == (292, 8, 50, 6)
    assert task.demonstrations is task.train and task.retain_eval is None
    assert os.listdir(tmp_path / "data") == [f"arithmetic-{arithmetic.arithmetic_fingerprint(_small(ops=['+']))}"]
    row = task.eval[0]
    assert task.reward(row["completion"], row["answer"]) == 1.0
    assert task.reward("12a", row["answer"]) == 0.0
    with pytest.raises(ConfigError, match="task.max_new_tokens=4 is invalid: expected at least 5"):
        build_task(_small(max_new_tokens=4), str(tmp_path))
    with pytest.raises(ConfigError, match="task.max_prompt_len=8 is invalid: expected at least 9"):
        build_task(_small(max_prompt_len=8), str(tmp_path))


def test_build_task_gsm8k(tmp_path):
    rows = [{"question": f"What is {i} plus 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(20)]
    train = _write_jsonl(tmp_path / "train.jsonl", rows)
    cfg = TaskConfig(name="gsm8k", train_path=train, num_eval=5, max_prompt_len=64, max_new_tokens=32)
    with pytest.raises(ConfigError, match="task.tokenizer_path"):
        build_task(cfg, str(tmp_path))

    tok_dir = str(tmp_path / "tok")
    text = "Question: Answer: " + "".join(r["question"] + r["answer"] for r in rows)
    build_char_tokenizer("".join(sorted(set(text)))).save(tok_dir)
    cfg.tokenizer_path = tok_dir
    task = build_task(cfg, str(tmp_path / "cache"))
    assert (len(task.train), len(task.eval)) == (15, 5)
    assert not set(task.train["prompt"]) & set(task.eval["prompt"])
    assert task.eval.to_dict() == build_task(cfg, str(tmp_path / "cache")).eval.to_dict()  # seeded holdout
    assert task.reward(" so #### " + task.eval[0]["answer"], task.eval[0]["answer"]) == 1.0

    cfg.eval_path = _write_jsonl(tmp_path / "eval.jsonl", rows[:3])
    cfg.preference_path = _write_jsonl(tmp_path / "pref.jsonl", [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}])
    task = build_task(cfg, str(tmp_path / "cache"))
    assert (len(task.train), len(task.eval), len(task.preference)) == (20, 3, 1)


def test_task_fingerprint_is_stable_and_tracks_the_data(tmp_path):
    base = task_fingerprint(TaskConfig())
    assert base == task_fingerprint(TaskConfig()) and len(base) == 16
    assert task_fingerprint(TaskConfig(max_new_tokens=16)) == base  # does not change the data
    assert task_fingerprint(TaskConfig(data_seed=1)) != base
    assert task_fingerprint(TaskConfig(ops=["+"])) != base
    path = _write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS)
    gsm = TaskConfig(name="gsm8k", train_path=path)
    before = task_fingerprint(gsm)
    _write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS[:2])  # edited in place
    assert task_fingerprint(gsm) != before


# ---------------------------------------------------------------- batching
def test_encode_prompts_left_pads():
    tok = build_char_tokenizer()
    prompt_BL, lens_B = encode_prompts(tok, ["1+2=", "10+20="], max_len=16)
    assert lens_B.tolist() == [5, 7]  # BOS included
    assert prompt_BL.shape == (2, 7)
    assert prompt_BL[0].tolist() == [tok.pad_id] * 2 + [tok.bos_id] + tok.encode("1+2=")
    assert prompt_BL[1].tolist() == [tok.bos_id] + tok.encode("10+20=")
    assert torch.equal(encode_prompts(tok, ["1+2=", "10+20="])[0], prompt_BL)  # max_len=None: no limit
    with pytest.raises(ValueError, match="prompt row 1 has 7 tokens > max_len=6"):
        encode_prompts(tok, ["1+2=", "10+20="], max_len=6)


def test_pack_sequences_masks_completion_and_eos():
    tok = build_char_tokenizer()
    tokens_BT, mask_BT = pack_sequences(tok, ["1+2=", "10+20="], ["3", "030"])
    assert tokens_BT.shape == mask_BT.shape == (2, 11) and mask_BT.dtype == torch.bool
    assert tokens_BT[0].tolist() == [tok.bos_id] + tok.encode("1+2=3") + [tok.eos_id] + [tok.pad_id] * 4
    assert tokens_BT[1].tolist() == [tok.bos_id] + tok.encode("10+20=030") + [tok.eos_id]
    assert mask_BT[0].nonzero().flatten().tolist() == [5, 6]  # "3", eos
    assert mask_BT[1].nonzero().flatten().tolist() == [7, 8, 9, 10]  # "030", eos
    assert tok.decode(tokens_BT[1][mask_BT[1]]) == "030"
    _, no_eos = pack_sequences(tok, ["1+2="], ["3"], add_eos=False)
    assert no_eos[0].nonzero().flatten().tolist() == [5]
    with pytest.raises(ValueError, match="row 1 has 7 prompt \\+ 4 completion tokens > max_len=10"):
        pack_sequences(tok, ["1+2=", "10+20="], ["3", "030"], max_len=10)

"""The ShareGPT JSON loader: prompt/output pairs, length estimates, tokenizers, errors."""

import json

import pytest

import kvlab.traces.sharegpt as sharegpt
from kvlab.errors import KvlabError
from kvlab.traces import load_sharegpt


def conversation(*turns, entry_id="c"):
    return {"id": entry_id, "conversations": [{"from": f, "value": v} for f, v in turns]}


def write(tmp_path, entries):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(entries, indent=1))
    return path


def test_first_human_turn_and_the_next_gpt_turn_make_a_request(tmp_path):
    path = write(tmp_path, [conversation(("system", "s" * 99), ("human", "x" * 9),
                                         ("gpt", "y" * 40), ("human", "z"), ("gpt", "w"))])
    (request,) = load_sharegpt(path).requests
    assert (request.input_len, request.output_len) == (3, 10)  # ceil(9/4), 40/4
    assert request.arrival_s == 0.0


def test_empty_texts_count_as_one_token(tmp_path):
    path = write(tmp_path, [conversation(("human", ""), ("gpt", ""))])
    (request,) = load_sharegpt(path).requests
    assert (request.input_len, request.output_len) == (1, 1)


def test_entries_without_a_human_gpt_pair_are_skipped_and_counted(tmp_path):
    path = write(tmp_path, [conversation(("gpt", "a")), conversation(("human", "b")),
                            conversation(("human", "c"), ("human", "d")),
                            conversation(("human", "e"), ("gpt", "f"))])
    trace = load_sharegpt(path)
    assert len(trace) == 1
    assert trace.metadata["num_skipped_entries"] == 3


def test_num_prompts_keeps_file_order(tmp_path):
    path = write(tmp_path, [conversation(("human", "a" * 4 * n), ("gpt", "b")) for n in (1, 2, 3)])
    assert [r.input_len for r in load_sharegpt(path, num_prompts=2).requests] == [1, 2]


def test_malformed_turn_names_the_entry(tmp_path):
    path = write(tmp_path, [conversation(("human", "a"), ("gpt", "b")),
                            {"id": "bad", "conversations": [{"from": "human", "value": 3}]}])
    with pytest.raises(KvlabError) as err:
        load_sharegpt(path)
    assert str(err.value).startswith(f"{path} [1] (id 'bad'), conversations[0]: expected an "
                                     'object with string "from" and "value"')


def test_invalid_json_names_line_and_column(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text('[\n {"id": "a",\n  "conversations": [}\n]')
    with pytest.raises(KvlabError, match=r"sharegpt.json line 3, column 21: not valid JSON"):
        load_sharegpt(path)


def test_missing_tokenizer_folder_is_an_error(tmp_path):
    path = write(tmp_path, [conversation(("human", "a"), ("gpt", "b"))])
    with pytest.raises(KvlabError, match=r"tokenizer .*nowhere: no such folder"):
        load_sharegpt(path, tokenizer=tmp_path / "nowhere")


class SpaceTokenizer:
    """A stand-in tokenizer: one id per word, a BOS id 1 unless special tokens are off."""

    def __call__(self, texts, add_special_tokens=True):
        bos = [1] if add_special_tokens else []
        return {"input_ids": [bos + [len(w) + 1 for w in t.split()] for t in texts]}


def test_tokenizer_gives_lengths_and_prompt_ids(tmp_path, monkeypatch):
    monkeypatch.setattr(sharegpt, "load_tokenizer", lambda path: SpaceTokenizer())
    path = write(tmp_path, [conversation(("human", "hi there"), ("gpt", "a bc def"))])
    (request,) = load_sharegpt(path, tokenizer="tok").requests
    assert (request.input_len, request.output_len) == (3, 3)
    assert request.prompt_token_ids == (1, 3, 6)


def test_prompts_that_tokenize_to_nothing_are_skipped(tmp_path, monkeypatch):
    class NoBos(SpaceTokenizer):
        def __call__(self, texts, add_special_tokens=True):
            return super().__call__(texts, add_special_tokens=False)

    monkeypatch.setattr(sharegpt, "load_tokenizer", lambda path: NoBos())
    path = write(tmp_path, [conversation(("human", " "), ("gpt", "x")),
                            conversation(("human", "a b"), ("gpt", ""))])
    trace = load_sharegpt(path, tokenizer="tok", num_prompts=1)
    assert [(r.input_len, r.output_len) for r in trace.requests] == [(2, 1)]
    assert trace.metadata["num_skipped_entries"] == 1


@pytest.mark.slow
def test_a_local_hugging_face_tokenizer_folder_is_used(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<s>": 1, "hello": 2, "world": 3}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                           special_tokens=[("<s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]",
                            bos_token="<s>").save_pretrained(tmp_path / "tok")
    path = write(tmp_path, [conversation(("human", "hello world again"), ("gpt", "hello"))])
    (request,) = load_sharegpt(path, tokenizer=tmp_path / "tok").requests
    assert request.prompt_token_ids == (1, 2, 3, 0)
    assert (request.input_len, request.output_len) == (4, 1)
